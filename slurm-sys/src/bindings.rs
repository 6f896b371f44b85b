//! bindgen's output over slurm.h, slurm_errno.h and spank.h (types and
//! constants only; see build.rs for why no functions).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
