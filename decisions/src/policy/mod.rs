//! The policy file (`/etc/slurm/onepool.toml`): model, loading and checks.

pub mod diag;
pub mod load;
pub mod model;

pub use diag::{Diagnostic, Severity};
pub use load::{load, Loaded};
pub use model::{Capacity, Class, Entitlement, Policy, Pool, Tier, TimeLimitRule};

/// Where slurmctld's plugin and the tools look for the policy by default.
pub const DEFAULT_PATH: &str = "/etc/slurm/onepool.toml";
/// Environment variable that overrides [`DEFAULT_PATH`].
pub const PATH_ENV: &str = "ONEPOOL_POLICY";
/// Partition QOS of the flexible partition (see `render`); no class may use it.
pub const FLEXIBLE_CAP_QOS: &str = "onepool-flexible-cap";
