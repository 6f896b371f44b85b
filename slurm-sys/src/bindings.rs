//! bindgen's output over slurm.h, slurm_errno.h and spank.h (types and
//! constants only; see build.rs for why no functions). Generated code: the
//! `unsafe` blocks bindgen writes (zeroed `Default` impls) carry no SAFETY
//! comments of ours.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
