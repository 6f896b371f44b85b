//! slurmctld's job description (`job_desc_msg_t`) as a job_submit plugin
//! reads and changes it: numbers read directly, strings copied out, and
//! strings written with Slurm's allocator (see [`crate::xstring`]).

use std::ffi::c_char;

use crate::bindings::job_desc_msg_t;
use crate::entry::FromC;
use crate::xstring::{self, XstringError};

/// The string fields onepool reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StrField {
    Account,
    AdminComment,
    /// The job as `scontrol update` names it.
    JobIdStr,
    Partition,
    Qos,
    TresPerJob,
    TresPerNode,
    TresPerSocket,
    TresPerTask,
}

impl StrField {
    pub const ALL: [StrField; 9] = [
        StrField::Account,
        StrField::AdminComment,
        StrField::JobIdStr,
        StrField::Partition,
        StrField::Qos,
        StrField::TresPerJob,
        StrField::TresPerNode,
        StrField::TresPerSocket,
        StrField::TresPerTask,
    ];

    fn slot(self, d: &mut job_desc_msg_t) -> &mut *mut c_char {
        match self {
            StrField::Account => &mut d.account,
            StrField::AdminComment => &mut d.admin_comment,
            StrField::JobIdStr => &mut d.job_id_str,
            StrField::Partition => &mut d.partition,
            StrField::Qos => &mut d.qos,
            StrField::TresPerJob => &mut d.tres_per_job,
            StrField::TresPerNode => &mut d.tres_per_node,
            StrField::TresPerSocket => &mut d.tres_per_socket,
            StrField::TresPerTask => &mut d.tres_per_task,
        }
    }

    fn get(self, d: &job_desc_msg_t) -> *const c_char {
        match self {
            StrField::Account => d.account,
            StrField::AdminComment => d.admin_comment,
            StrField::JobIdStr => d.job_id_str,
            StrField::Partition => d.partition,
            StrField::Qos => d.qos,
            StrField::TresPerJob => d.tres_per_job,
            StrField::TresPerNode => d.tres_per_node,
            StrField::TresPerSocket => d.tres_per_socket,
            StrField::TresPerTask => d.tres_per_task,
        }
    }
}

/// A job description slurmctld handed to the plugin, for one call.
///
/// Its invariant, which every way of getting one upholds: each
/// [`StrField`] is NULL or a NUL-terminated string from Slurm's allocator,
/// and `spank_job_env` is NULL or holds `spank_job_env_size` pointers,
/// each NULL or a NUL-terminated string. Only this type writes those
/// fields, and only with Slurm's allocator.
#[repr(transparent)]
pub struct JobDesc(job_desc_msg_t);

impl JobDesc {
    /// # Safety
    /// `d` is NULL or points to a job description that meets the type's
    /// invariant and that nothing else touches for `'a`.
    pub unsafe fn from_ptr<'a>(d: *mut job_desc_msg_t) -> Option<&'a mut JobDesc> {
        // SAFETY: `JobDesc` is a transparent wrapper; the caller vouches
        // for the rest.
        unsafe { d.cast::<JobDesc>().as_mut() }
    }

    /// The fields as C declares them, for reading numbers (pointers in it
    /// are only readable through `unsafe`).
    pub fn raw(&self) -> &job_desc_msg_t {
        &self.0
    }

    /// The numeric job id (NO_VAL on submission and in `scontrol update`
    /// by name), wherever this release keeps it.
    pub fn job_id(&self) -> u32 {
        crate::compat::job_desc_job_id(&self.0)
    }

    /// A copy of string field `f`, `None` for NULL (invalid UTF-8 replaced).
    pub fn get(&self, f: StrField) -> Option<String> {
        // SAFETY: NULL or a NUL-terminated string (the type's invariant).
        unsafe { xstring::read(f.get(&self.0)) }
    }

    /// Replaces field `f` with an `xstrdup` copy of `value`, freeing the
    /// old string with `xfree`. On error the field is left as it was.
    pub fn set(&mut self, f: StrField, value: &str) -> Result<(), XstringError> {
        // SAFETY: the slot holds NULL or a string of Slurm's (the type's invariant).
        unsafe { xstring::replace(f.slot(&mut self.0), value) }
    }

    /// Frees field `f` with `xfree` and sets it to NULL.
    pub fn clear(&mut self, f: StrField) {
        // SAFETY: as in `set`.
        unsafe { xstring::xfree(f.slot(&mut self.0)) }
    }

    /// `time_limit`, in minutes.
    pub fn set_time_limit(&mut self, minutes: u32) {
        self.0.time_limit = minutes;
    }

    /// Copies of the first `max` entries of the job's SPANK environment
    /// (NULL entries skipped): a client can send any number.
    pub fn spank_env(&self, max: usize) -> Vec<String> {
        let d = &self.0;
        if d.spank_job_env.is_null() {
            return Vec::new();
        }
        let n = (d.spank_job_env_size as usize).min(max);
        // SAFETY: `i < spank_job_env_size` entries, each NULL or a C string
        // (the type's invariant).
        (0..n).filter_map(|i| unsafe { xstring::read(*d.spank_job_env.add(i)) }).collect()
    }
}

impl FromC<*mut job_desc_msg_t> for Option<&mut JobDesc> {
    /// `raw` is NULL or slurmctld's job description for this call.
    unsafe fn from_c(raw: *mut job_desc_msg_t) -> Self {
        // SAFETY: the caller's promise is `from_ptr`'s.
        unsafe { JobDesc::from_ptr(raw) }
    }
}

impl FromC<*mut job_desc_msg_t> for Option<&JobDesc> {
    /// `raw` is NULL or slurmctld's job description for this call.
    unsafe fn from_c(raw: *mut job_desc_msg_t) -> Self {
        // SAFETY: the caller's promise is `from_ptr`'s.
        unsafe { JobDesc::from_ptr(raw) }.map(|d| &*d)
    }
}

#[cfg(any(test, feature = "test-support"))]
pub use test_job_desc::TestJobDesc;

#[cfg(any(test, feature = "test-support"))]
mod test_job_desc {
    use std::ffi::c_char;

    use super::{JobDesc, StrField};
    use crate::bindings::job_desc_msg_t;
    use crate::xstring::{self, XstringError};

    /// A job description built in Rust, for tests, whose strings come from
    /// the allocator in force on this thread: install
    /// [`crate::xstring::libc_allocator::LibcAllocator`] first, and drop
    /// this before it. Dropping it frees every string it holds.
    pub struct TestJobDesc {
        desc: Box<JobDesc>,
        /// `spank_job_env`'s array (the strings in it are `xstrdup`'s).
        env: Vec<*mut c_char>,
    }

    impl TestJobDesc {
        /// All-zero (NULL strings, zero numbers), then `numbers` sets what
        /// a test needs; strings go through [`JobDesc::set`] and
        /// [`TestJobDesc::set_spank_env`].
        ///
        /// # Panics
        /// When `numbers` set a [`StrField`] or the SPANK environment.
        pub fn new(numbers: impl FnOnce(&mut job_desc_msg_t)) -> TestJobDesc {
            let mut d = job_desc_msg_t::default();
            numbers(&mut d);
            for f in StrField::ALL {
                assert!(f.get(&d).is_null(), "{f:?}: set strings with JobDesc::set");
            }
            assert!(d.spank_job_env.is_null() && d.spank_job_env_size == 0, "use set_spank_env");
            TestJobDesc { desc: Box::new(JobDesc(d)), env: Vec::new() }
        }

        /// Sets the SPANK environment to copies of `entries`.
        pub fn set_spank_env(&mut self, entries: &[&str]) -> Result<(), XstringError> {
            self.free_env();
            for e in entries {
                self.env.push(xstring::xstrdup(e)?);
            }
            self.desc.0.spank_job_env = self.env.as_mut_ptr();
            self.desc.0.spank_job_env_size = u32::try_from(self.env.len()).expect("a test's entries");
            Ok(())
        }

        fn free_env(&mut self) {
            self.desc.0.spank_job_env = std::ptr::null_mut();
            self.desc.0.spank_job_env_size = 0;
            for mut p in self.env.drain(..) {
                // SAFETY: `p` came from xstrdup and is freed once.
                unsafe { xstring::xfree(&mut p) };
            }
        }
    }

    impl std::ops::Deref for TestJobDesc {
        type Target = JobDesc;
        fn deref(&self) -> &JobDesc {
            &self.desc
        }
    }

    impl std::ops::DerefMut for TestJobDesc {
        fn deref_mut(&mut self) -> &mut JobDesc {
            &mut self.desc
        }
    }

    impl Drop for TestJobDesc {
        fn drop(&mut self) {
            self.free_env();
            for f in StrField::ALL {
                self.desc.clear(f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xstring::libc_allocator::LibcAllocator;

    #[test]
    fn strings_are_read_replaced_and_freed() {
        let alloc = LibcAllocator::install();
        let mut d = TestJobDesc::new(|d| d.time_limit = 5);
        assert_eq!(d.raw().time_limit, 5);
        for f in StrField::ALL {
            assert_eq!(d.get(f), None, "{f:?}");
            d.set(f, &format!("{f:?}")).unwrap();
        }
        for f in StrField::ALL {
            assert_eq!(d.get(f), Some(format!("{f:?}")), "{f:?}");
        }
        d.set(StrField::Qos, "high").unwrap();
        d.clear(StrField::Partition);
        assert_eq!((d.get(StrField::Qos).as_deref(), d.get(StrField::Partition)), (Some("high"), None));
        d.set_time_limit(90);
        assert_eq!(d.raw().time_limit, 90);
        d.set_spank_env(&["A=1", "B=2"]).unwrap();
        assert_eq!(d.spank_env(16), ["A=1", "B=2"]);
        assert_eq!(d.spank_env(1), ["A=1"]);
        drop(d);
        assert_eq!((alloc.live(), alloc.foreign_frees()), (0, 0));
        assert_eq!(alloc.allocated(), alloc.freed());
    }

    #[test]
    #[should_panic(expected = "Qos: set strings with JobDesc::set")]
    fn test_descriptions_take_no_raw_strings() {
        TestJobDesc::new(|d| d.qos = c"x".as_ptr().cast_mut());
    }

    #[test]
    fn null_is_no_description() {
        // SAFETY: NULL.
        assert!(unsafe { Option::<&mut JobDesc>::from_c(std::ptr::null_mut()) }.is_none());
        // SAFETY: NULL.
        assert!(unsafe { Option::<&JobDesc>::from_c(std::ptr::null_mut()) }.is_none());
    }
}
