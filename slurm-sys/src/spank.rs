//! The SPANK API as a plugin body uses it: a handle valid for one
//! callback, its arguments, the options table Slurm keeps pointers into,
//! and the calls onepool makes, each resolved from the host process
//! ([`crate::host`]) and answering [`SpankError::Unavailable`] where the
//! host does not export it.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, CStr};
use std::marker::PhantomData;

use crate::bindings::{slurm_err_t, spank_context, spank_item, spank_option, spank_t};
use crate::entry::FromC;
use crate::host;
use crate::log::to_cstring_lossy;

/// Why a SPANK call did not do its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpankError {
    /// The process that loaded the plugin does not export this function.
    Unavailable(&'static str),
    /// The function answered this `spank_err_t`.
    Code(c_int),
}

impl std::fmt::Display for SpankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpankError::Unavailable(name) => write!(f, "{name} is not available in this process"),
            SpankError::Code(rc) => write!(f, "spank error {rc}"),
        }
    }
}

impl std::error::Error for SpankError {}

fn check(rc: c_int) -> Result<(), SpankError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(SpankError::Code(rc))
    }
}

/// What Slurm says the current context is (`S_CTX_ERROR` where the host
/// has no `spank_context`).
pub fn context() -> spank_context::Type {
    // SAFETY: spank_context() takes no arguments and only reads Slurm state.
    host::spank_context().map(|f| unsafe { f() }).unwrap_or(spank_context::S_CTX_ERROR)
}

/// The SPANK handle of the callback being run; the lifetime keeps it from
/// outliving the call.
#[derive(Clone, Copy)]
pub struct Spank<'a> {
    sp: spank_t,
    _call: PhantomData<&'a ()>,
}

impl Spank<'_> {
    /// # Safety
    /// `sp` is the handle Slurm passed to the SPANK callback being run; the
    /// value is used only during that call.
    pub unsafe fn from_raw(sp: spank_t) -> Self {
        Spank { sp, _call: PhantomData }
    }

    /// `S_JOB_ID`.
    pub fn job_id(&self) -> Option<u32> {
        let get = host::spank_get_item()?;
        let mut id: u32 = 0;
        // SAFETY: a live handle; S_JOB_ID takes one `uint32_t *`.
        let rc = unsafe { get(self.sp, spank_item::S_JOB_ID, &mut id as *mut u32) };
        (rc == 0).then_some(id)
    }

    /// `S_JOB_UID`.
    pub fn job_uid(&self) -> Option<u32> {
        let get = host::spank_get_item()?;
        let mut uid: libc::uid_t = 0;
        // SAFETY: a live handle; S_JOB_UID takes one `uid_t *`.
        let rc = unsafe { get(self.sp, spank_item::S_JOB_UID, &mut uid as *mut libc::uid_t) };
        (rc == 0).then_some(uid)
    }

    /// `spank_getenv`: `name` in the job's environment (slurmstepd). The
    /// buffer starts at [`GETENV_FIRST`] bytes and doubles while Slurm
    /// answers ESPANK_NOSPACE, up to [`GETENV_MAX`].
    pub fn getenv(&self, name: &str) -> Result<String, SpankError> {
        let getenv = host::spank_getenv().ok_or(SpankError::Unavailable("spank_getenv"))?;
        let name = to_cstring_lossy(name);
        getenv_growing(GETENV_FIRST, GETENV_MAX, |buf| {
            let len = c_int::try_from(buf.len()).unwrap_or(c_int::MAX);
            // SAFETY: a live handle, a NUL-terminated name and a buffer of
            // at least `len` bytes, which spank_getenv NUL-terminates.
            unsafe { getenv(self.sp, name.as_ptr(), buf.as_mut_ptr().cast::<c_char>(), len) }
        })
        .map_err(SpankError::Code)
    }

    /// `spank_setenv`: sets `name` in the job's environment (slurmstepd).
    pub fn setenv(&self, name: &str, value: &str, overwrite: bool) -> Result<(), SpankError> {
        let setenv = host::spank_setenv().ok_or(SpankError::Unavailable("spank_setenv"))?;
        let (n, v) = (to_cstring_lossy(name), to_cstring_lossy(value));
        // SAFETY: a live handle and NUL-terminated strings, which Slurm copies.
        check(unsafe { setenv(self.sp, n.as_ptr(), v.as_ptr(), c_int::from(overwrite)) })
    }

    /// `spank_job_control_setenv`: sets `name` in the environment sent
    /// with the job to slurmctld (srun, sbatch, salloc).
    pub fn job_control_setenv(&self, name: &str, value: &str, overwrite: bool) -> Result<(), SpankError> {
        let setenv = host::spank_job_control_setenv().ok_or(SpankError::Unavailable("spank_job_control_setenv"))?;
        let (n, v) = (to_cstring_lossy(name), to_cstring_lossy(value));
        // SAFETY: a live handle and NUL-terminated strings, which Slurm copies.
        check(unsafe { setenv(self.sp, n.as_ptr(), v.as_ptr(), c_int::from(overwrite)) })
    }

    /// `spank_option_register` of option `i` of `table` (which Slurm keeps
    /// a pointer to, hence `'static`).
    pub fn option_register<const N: usize>(&self, table: &'static SpankOptions<N>, i: usize) -> Result<(), SpankError> {
        let register = host::spank_option_register().ok_or(SpankError::Unavailable("spank_option_register"))?;
        // SAFETY: a live handle and a pointer into a static table, which
        // Slurm only reads.
        check(unsafe { register(self.sp, table.entry(i)) })
    }

    /// `spank_option_getopt` of option `i` of `table`: `None` when the
    /// option was not used, its argument (empty for an option without one)
    /// when it was.
    pub fn option_getopt<const N: usize>(
        &self,
        table: &'static SpankOptions<N>,
        i: usize,
    ) -> Result<Option<String>, SpankError> {
        let getopt = host::spank_option_getopt().ok_or(SpankError::Unavailable("spank_option_getopt"))?;
        let mut arg: *mut c_char = std::ptr::null_mut();
        // SAFETY: a live handle, a pointer into a static table and a
        // `char **` that Slurm sets to a string of its own (not ours to free).
        let rc = unsafe { getopt(self.sp, table.entry(i), &mut arg) };
        match rc {
            0 => Ok(Some(
                // SAFETY: on success `arg` is NULL or Slurm's NUL-terminated argument.
                unsafe { crate::xstring::read(arg) }.unwrap_or_default(),
            )),
            rc if rc == slurm_err_t::ESPANK_ERROR as c_int => Ok(None),
            rc => Err(SpankError::Code(rc)),
        }
    }
}

impl FromC<spank_t> for Spank<'_> {
    /// `raw` is the handle of the SPANK callback being run.
    unsafe fn from_c(raw: spank_t) -> Self {
        // SAFETY: the caller's promise is `from_raw`'s.
        unsafe { Spank::from_raw(raw) }
    }
}

/// A SPANK callback's plugstack.conf arguments (`int ac, char **av`).
#[derive(Clone, Copy)]
pub struct SpankArgs<'a> {
    ac: c_int,
    av: *const *const c_char,
    _call: PhantomData<&'a ()>,
}

impl SpankArgs<'_> {
    /// # Safety
    /// `av` is NULL or holds `ac` pointers, each NULL or a NUL-terminated
    /// string, all valid during the callback being run.
    pub unsafe fn from_raw(ac: c_int, av: *mut *mut c_char) -> Self {
        SpankArgs { ac, av: av.cast_const().cast::<*const c_char>(), _call: PhantomData }
    }

    /// The arguments, in order (NULL entries skipped).
    pub fn to_vec(&self) -> Vec<String> {
        if self.av.is_null() {
            return Vec::new();
        }
        (0..usize::try_from(self.ac).unwrap_or(0))
            // SAFETY: `i < ac` entries of `av`, each NULL or a C string (from_raw).
            .filter_map(|i| unsafe { crate::xstring::read(*self.av.add(i)) })
            .collect()
    }
}

/// What Slurm calls when an option is given: `(val, optarg, remote)`.
pub type OptionCallback = unsafe extern "C" fn(val: c_int, optarg: *const c_char, remote: c_int) -> c_int;

/// One option of a [`SpankOptions`] table, built from static strings only,
/// so that Slurm may keep pointers to them.
#[derive(Clone, Copy)]
pub struct SpankOption {
    name: &'static CStr,
    arginfo: &'static CStr,
    usage: &'static CStr,
    has_arg: bool,
    val: c_int,
    cb: OptionCallback,
}

impl SpankOption {
    /// `--NAME[=ARGINFO]`, shown with `usage`; Slurm calls `cb` with `val`.
    pub const fn new(
        name: &'static CStr,
        arginfo: &'static CStr,
        usage: &'static CStr,
        has_arg: bool,
        val: c_int,
        cb: OptionCallback,
    ) -> SpankOption {
        SpankOption { name, arginfo, usage, has_arg, val, cb }
    }

    pub fn name(&self) -> &'static CStr {
        self.name
    }

    pub fn arginfo(&self) -> &'static CStr {
        self.arginfo
    }

    pub fn val(&self) -> c_int {
        self.val
    }

    const fn to_c(self) -> spank_option {
        spank_option {
            name: self.name.as_ptr().cast_mut(),
            arginfo: self.arginfo.as_ptr().cast_mut(),
            usage: self.usage.as_ptr().cast_mut(),
            has_arg: self.has_arg as c_int,
            val: self.val,
            cb: Some(self.cb),
        }
    }
}

/// A plugin's options, for [`Spank::option_register`]. Slurm keeps a
/// pointer to each registered `struct spank_option` (declared `*mut`), so
/// the C table lives in a static, in an `UnsafeCell`.
pub struct SpankOptions<const N: usize> {
    options: [SpankOption; N],
    c: UnsafeCell<[spank_option; N]>,
}

// SAFETY: Slurm only reads the C table, and nothing in Rust writes it
// after the const constructor.
unsafe impl<const N: usize> Sync for SpankOptions<N> {}

impl<const N: usize> SpankOptions<N> {
    pub const fn new(options: [SpankOption; N]) -> Self {
        let mut c = [spank_option {
            name: std::ptr::null_mut(),
            arginfo: std::ptr::null_mut(),
            usage: std::ptr::null_mut(),
            has_arg: 0,
            val: 0,
            cb: None,
        }; N];
        let mut i = 0;
        while i < N {
            c[i] = options[i].to_c();
            i += 1;
        }
        SpankOptions { options, c: UnsafeCell::new(c) }
    }

    /// Option `i` as it was declared.
    pub fn get(&self, i: usize) -> Option<&SpankOption> {
        self.options.get(i)
    }

    /// The C struct Slurm receives for option `i`.
    fn entry(&self, i: usize) -> *mut spank_option {
        assert!(i < N, "option {i} of a table of {N}");
        self.c.get().cast::<spank_option>().wrapping_add(i)
    }
}

/// spank_getenv's first buffer (the size onepool always used) and its
/// bound: values are environment entries, which the kernel caps at 128 KiB
/// each when the job's processes are started.
pub const GETENV_FIRST: usize = 512;
pub const GETENV_MAX: usize = 1 << 20;

/// Calls `get` with a buffer of `first` bytes, doubled while `get` answers
/// ESPANK_NOSPACE, up to `max`; on success reads the NUL-terminated value
/// (invalid UTF-8 replaced). The seam between the growth and Slurm.
fn getenv_growing(first: usize, max: usize, mut get: impl FnMut(&mut [u8]) -> c_int) -> Result<String, c_int> {
    onepool_os::grow(first, max, |buf| match get(buf) {
        0 => {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
        }
        rc if rc == slurm_err_t::ESPANK_NOSPACE as c_int => Err(onepool_os::Grow::TooSmall(rc)),
        rc => Err(onepool_os::Grow::Failed(rc)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spank_getenv as slurmstepd implements it: strlcpy, ESPANK_NOSPACE
    /// when the value was cut.
    fn slurmstepd_getenv<'a>(value: &'a str, calls: &'a mut Vec<usize>) -> impl FnMut(&mut [u8]) -> c_int + 'a {
        move |buf| {
            calls.push(buf.len());
            let n = value.len().min(buf.len() - 1);
            buf[..n].copy_from_slice(&value.as_bytes()[..n]);
            buf[n] = 0;
            if value.len() >= buf.len() {
                slurm_err_t::ESPANK_NOSPACE as c_int
            } else {
                0
            }
        }
    }

    #[test]
    fn getenv_grows_until_the_value_fits() {
        let value = "x".repeat(2000);
        let mut calls = Vec::new();
        let got = getenv_growing(GETENV_FIRST, GETENV_MAX, slurmstepd_getenv(&value, &mut calls));
        assert_eq!(got.as_deref(), Ok(value.as_str()));
        assert_eq!(calls, [512, 1024, 2048]);
    }

    #[test]
    fn getenv_stops_at_its_bound_and_passes_other_errors_on() {
        let value = "x".repeat(5000);
        let mut calls = Vec::new();
        let got = getenv_growing(512, 3000, slurmstepd_getenv(&value, &mut calls));
        assert_eq!(got, Err(slurm_err_t::ESPANK_NOSPACE as c_int));
        assert_eq!(calls, [512, 1024, 2048, 3000]);
        let noexist = slurm_err_t::ESPANK_ENV_NOEXIST as c_int;
        let mut n = 0;
        let got = getenv_growing(512, GETENV_MAX, |_| {
            n += 1;
            noexist
        });
        assert_eq!((got, n), (Err(noexist), 1));
        let mut calls = Vec::new();
        assert_eq!(getenv_growing(512, GETENV_MAX, slurmstepd_getenv("short", &mut calls)).as_deref(), Ok("short"));
        assert_eq!(calls, [512]);
    }

    extern "C" fn nothing(_: c_int, _: *const c_char, _: c_int) -> c_int {
        0
    }

    static TABLE: SpankOptions<2> = SpankOptions::new([
        SpankOption::new(c"one", c"A", c"first", true, 0, nothing),
        SpankOption::new(c"two", c"B", c"second", false, 1, nothing),
    ]);

    #[test]
    fn the_c_table_is_the_declared_one() {
        for i in 0..2 {
            let o = TABLE.get(i).unwrap();
            // SAFETY: an in-bounds pointer into a static table nothing writes.
            let c = unsafe { &*TABLE.entry(i) };
            assert_eq!((c.name.cast_const(), c.arginfo.cast_const()), (o.name().as_ptr(), o.arginfo().as_ptr()));
            assert_eq!((c.has_arg, c.val), (if i == 0 { 1 } else { 0 }, o.val()));
            assert!(c.cb.is_some());
        }
        assert!(TABLE.get(2).is_none());
    }

    #[test]
    fn outside_slurm_every_call_says_so() {
        assert_eq!(context(), spank_context::S_CTX_ERROR);
        // SAFETY: never passed to Slurm: every call stops at the missing symbol.
        let sp = unsafe { Spank::from_raw(std::ptr::null_mut()) };
        assert_eq!(sp.getenv("X"), Err(SpankError::Unavailable("spank_getenv")));
        assert_eq!(sp.setenv("X", "1", true), Err(SpankError::Unavailable("spank_setenv")));
        let e = sp.job_control_setenv("X", "1", true).unwrap_err();
        assert_eq!(e.to_string(), "spank_job_control_setenv is not available in this process");
        assert_eq!(sp.option_register(&TABLE, 0), Err(SpankError::Unavailable("spank_option_register")));
        assert_eq!(sp.option_getopt(&TABLE, 0), Err(SpankError::Unavailable("spank_option_getopt")));
        assert_eq!((sp.job_id(), sp.job_uid()), (None, None));
        assert_eq!(SpankError::Code(3001).to_string(), "spank error 3001");
    }

    #[test]
    fn arguments_are_copied_and_null_skipped() {
        let a = [c"gpu_source=none".as_ptr(), std::ptr::null(), c"x=1".as_ptr()];
        // SAFETY: three entries, each NULL or a static C string.
        let args = unsafe { SpankArgs::from_raw(3, a.as_ptr().cast_mut().cast()) };
        assert_eq!(args.to_vec(), ["gpu_source=none", "x=1"]);
        // SAFETY: NULL `av`.
        assert!(unsafe { SpankArgs::from_raw(2, std::ptr::null_mut()) }.to_vec().is_empty());
    }
}
