//! A thin client over libslurm (loaded at run time, as any API user would
//! link it) for tests and benchmarks that must submit jobs without sbatch:
//! forged SPANK annotations, and thousands of submissions from one process.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use slurm_sys::bindings::{job_desc_msg_t, submit_response_msg_t};

pub struct LibSlurm {
    init_desc: extern "C" fn(*mut job_desc_msg_t),
    submit: extern "C" fn(*mut job_desc_msg_t, *mut *mut submit_response_msg_t) -> c_int,
    free_resp: extern "C" fn(*mut submit_response_msg_t),
    /// `slurm_get_errno` up to 23.11; later releases leave Slurm's error
    /// in `errno` alone (24.11 dropped the function: measured).
    errno: Option<extern "C" fn() -> c_int>,
    strerror: extern "C" fn(c_int) -> *const c_char,
}

fn sym<T: Copy>(lib: *mut c_void, name: &CStr) -> T {
    // SAFETY: dlsym on a handle we opened.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    assert!(!p.is_null(), "libslurm lacks {name:?}");
    // SAFETY: T is the function pointer type of that symbol.
    unsafe { std::mem::transmute_copy(&p) }
}

/// One job to submit.
#[derive(Debug, Clone, Default)]
pub struct Job {
    pub name: String,
    pub qos: Option<String>,
    pub partition: Option<String>,
    pub time_limit_min: Option<u32>,
    pub gpus: Option<u32>,
    pub gpus_per_node: Option<u32>,
    pub min_nodes: Option<u32>,
    pub max_nodes: Option<u32>,
    /// Slurm lets only administrators set it; a user's try must not stick.
    pub admin_comment: Option<String>,
    pub hold: bool,
    pub spank_env: Vec<String>,
}

impl LibSlurm {
    pub fn load() -> LibSlurm {
        let lib = [c"libslurm.so.38", c"libslurm.so"]
            .iter()
            // SAFETY: loading a system library.
            .map(|n| unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) })
            .find(|h| !h.is_null())
            .expect("cannot load libslurm (apt-get install libslurm38)");
        let slurm_init: extern "C" fn(*const c_char) = sym(lib, c"slurm_init");
        slurm_init(std::ptr::null());
        LibSlurm {
            init_desc: sym(lib, c"slurm_init_job_desc_msg"),
            submit: sym(lib, c"slurm_submit_batch_job"),
            free_resp: sym(lib, c"slurm_free_submit_response_response_msg"),
            // SAFETY: dlsym on a handle we opened; `int (*)(void)` if present.
            errno: unsafe {
                let p = libc::dlsym(lib, c"slurm_get_errno".as_ptr());
                (!p.is_null()).then(|| std::mem::transmute::<*mut c_void, extern "C" fn() -> c_int>(p))
            },
            strerror: sym(lib, c"slurm_strerror"),
        }
    }

    /// Submits `job` as the calling user; the job id, or Slurm's error text.
    pub fn submit(&self, job: &Job) -> Result<u32, String> {
        // SAFETY: job_desc_msg_t is plain C data (pointers and integers);
        // all-zero is valid, and slurm_init_job_desc_msg sets it up next.
        let mut d: job_desc_msg_t = unsafe { std::mem::zeroed() };
        (self.init_desc)(&mut d);
        let c = |s: &str| CString::new(s).expect("no NUL");
        let name = c(&job.name);
        let script = c("#!/bin/sh\ntrue\n");
        let cwd = c("/tmp");
        let out = c("/dev/null");
        let path_env = c("PATH=/usr/bin:/bin");
        let mut environment = [path_env.as_ptr() as *mut c_char];
        let spank: Vec<CString> = job.spank_env.iter().map(|s| c(s)).collect();
        let mut spank_ptrs: Vec<*mut c_char> = spank.iter().map(|s| s.as_ptr() as *mut c_char).collect();
        let qos = job.qos.as_deref().map(c);
        let partition = job.partition.as_deref().map(c);
        let tres = job.gpus.map(|g| c(&format!("gres:gpu:{g}")));
        let tres_node = job.gpus_per_node.map(|g| c(&format!("gres:gpu:{g}")));
        let admin_comment = job.admin_comment.as_deref().map(c);
        d.name = name.as_ptr() as *mut c_char;
        d.script = script.as_ptr() as *mut c_char;
        d.work_dir = cwd.as_ptr() as *mut c_char;
        d.std_out = out.as_ptr() as *mut c_char;
        d.environment = environment.as_mut_ptr();
        d.env_size = 1;
        if !spank_ptrs.is_empty() {
            d.spank_job_env = spank_ptrs.as_mut_ptr();
            d.spank_job_env_size = spank_ptrs.len() as u32;
        }
        // SAFETY: getuid has no preconditions.
        d.user_id = unsafe { libc::getuid() };
        // SAFETY: getgid has no preconditions.
        d.group_id = unsafe { libc::getgid() };
        d.min_nodes = job.min_nodes.unwrap_or(1);
        if let Some(n) = job.max_nodes {
            d.max_nodes = n;
        }
        if let Some(t) = &tres_node {
            d.tres_per_node = t.as_ptr() as *mut c_char;
        }
        if let Some(a) = &admin_comment {
            d.admin_comment = a.as_ptr() as *mut c_char;
        }
        if job.hold {
            d.priority = 0;
        }
        if let Some(q) = &qos {
            d.qos = q.as_ptr() as *mut c_char;
        }
        if let Some(p) = &partition {
            d.partition = p.as_ptr() as *mut c_char;
        }
        if let Some(t) = job.time_limit_min {
            d.time_limit = t;
        }
        if let Some(t) = &tres {
            d.tres_per_job = t.as_ptr() as *mut c_char;
        }
        let mut resp: *mut submit_response_msg_t = std::ptr::null_mut();
        let rc = (self.submit)(&mut d, &mut resp);
        if rc != 0 {
            let code = match self.errno {
                Some(f) => f(),
                None => std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            };
            // SAFETY: slurm_strerror returns a static string.
            return Err(unsafe { CStr::from_ptr((self.strerror)(code)) }.to_string_lossy().into_owned());
        }
        // SAFETY: on success resp points to Slurm's response, freed by Slurm.
        let id = slurm_sys::compat::submit_response_job_id(unsafe { &*resp });
        (self.free_resp)(resp);
        Ok(id)
    }
}
