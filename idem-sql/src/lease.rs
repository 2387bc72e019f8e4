//! The statements of leases (the table `idem_leases`) and of scheduled jobs (the table
//! `idem_jobs`), and how each dialect spells them. Every value is bound.
//!
//! **Time is the database's**, as in the inbox (see [`crate::inbox`]): every statement
//! takes the time as one parameter, `COALESCE($n, <the database's now>)`, bound NULL by
//! default; the templates write the database's now as `{now}`.
//!
//! A row's `fence` is a **fencing token**: it rises by one with every holder (of a lease,
//! or of a job's leased run), and every write of a holder is conditioned on it, so a
//! holder that lost its lease (paused past its end, partitioned) writes nothing.

use crate::dialect::Dialect;
use std::sync::LazyLock;

/// Makes a lease's row if it has none (expired, fence 0). `$1` name.
pub const LEASE_ENSURE: &str = "INSERT INTO idem_leases (name, fence, holder, lease_until, updated_at) \
    VALUES ($1, 0, '', 0, 0) ON CONFLICT (name) DO NOTHING";

/// [`LEASE_ENSURE`] on MySQL (no `ON CONFLICT`).
pub const LEASE_ENSURE_MYSQL: &str = "INSERT INTO idem_leases (name, fence, holder, lease_until, updated_at) \
    VALUES ($1, 0, '', 0, 0) ON DUPLICATE KEY UPDATE name = name";

/// Takes a lease that has ended: the next fencing token, this holder, until now plus the
/// lease. `$1` name, `$2` holder, `$3` the lease in milliseconds, `$4` now (NULL: the
/// database's). Updates nothing while another holder's lease lasts.
pub const LEASE_ACQUIRE: &str = "UPDATE idem_leases SET fence = fence + 1, holder = $2, \
    lease_until = COALESCE($4, {now}) + $3, updated_at = COALESCE($4, {now}) \
    WHERE name = $1 AND lease_until <= COALESCE($4, {now})";

/// A lease's row, with the time it is judged by. `$1` name, `$2` now (NULL: the
/// database's).
pub const LEASE_READ: &str = "SELECT fence, holder, lease_until, COALESCE($2, {now}) AS now \
    FROM idem_leases WHERE name = $1";

/// Extends a lease its holder still holds (no later holder took it: same fence) to now plus
/// the lease. `$1` name, `$2` fence, `$3` the lease in milliseconds, `$4` now.
pub const LEASE_EXTEND: &str = "UPDATE idem_leases SET lease_until = COALESCE($4, {now}) + $3, \
    updated_at = COALESCE($4, {now}) WHERE name = $1 AND fence = $2";

/// Ends a lease its holder still holds, keeping its fence (the next holder's is higher).
/// `$1` name, `$2` fence, `$3` now.
pub const LEASE_RELEASE: &str = "UPDATE idem_leases SET lease_until = 0, \
    updated_at = COALESCE($3, {now}) WHERE name = $1 AND fence = $2";

/// Makes a job's row if it has none. `$1` job, `$2` its first occurrence (milliseconds),
/// `$3` now.
pub const JOB_ENSURE: &str = "INSERT INTO idem_jobs (job, next_at, fence, running_at, lease_until, \
    attempts, last_at, result, error, updated_at) \
    VALUES ($1, $2, 0, NULL, NULL, 0, NULL, NULL, NULL, COALESCE($3, {now})) \
    ON CONFLICT (job) DO NOTHING";

/// [`JOB_ENSURE`] on MySQL.
pub const JOB_ENSURE_MYSQL: &str = "INSERT INTO idem_jobs (job, next_at, fence, running_at, lease_until, \
    attempts, last_at, result, error, updated_at) \
    VALUES ($1, $2, 0, NULL, NULL, 0, NULL, NULL, NULL, COALESCE($3, {now})) \
    ON DUPLICATE KEY UPDATE job = job";

/// A job's row, with the time it is judged by. `$1` job, `$2` now.
pub const JOB_READ: &str = "SELECT next_at, fence, running_at, lease_until, attempts, last_at, error, \
    COALESCE($2, {now}) AS now FROM idem_jobs WHERE job = $1";

/// Moves a job's first occurrence not yet run from `$2` to `$3` (the occurrences between
/// are skipped), unless another instance moved it first or a run holds the job. `$1` job,
/// `$4` now.
pub const JOB_SKIP: &str = "UPDATE idem_jobs SET next_at = $3, attempts = 0, running_at = NULL, \
    error = NULL, updated_at = COALESCE($4, {now}) \
    WHERE job = $1 AND next_at = $2 AND (lease_until IS NULL OR lease_until <= COALESCE($4, {now}))";

/// Records an occurrence in the transaction of its body: the job's first occurrence not yet
/// run moves from `$2` to `$3` (just after the occurrence `$5`), if the occurrence is due by
/// now and now is before `$6` (the next occurrence, or the deadline, for a record made
/// without reading the row first), unless another instance moved the job first or a run
/// holds it. The row stays locked until the commit, so a second instance's record of the
/// same occurrence waits for it and then records nothing. `$1` job, `$4` now.
pub const JOB_OCCUR: &str = "UPDATE idem_jobs SET next_at = $3, last_at = $5, attempts = 0, \
    running_at = NULL, lease_until = NULL, result = NULL, error = NULL, \
    updated_at = COALESCE($4, {now}) \
    WHERE job = $1 AND next_at = $2 AND $5 <= COALESCE($4, {now}) AND COALESCE($4, {now}) < $6 \
    AND (lease_until IS NULL OR lease_until <= COALESCE($4, {now}))";

/// Stores the result of the occurrence just recorded. `$1` job, `$2` result.
pub const JOB_STORE: &str = "UPDATE idem_jobs SET result = $2 WHERE job = $1";

/// Records a failed attempt of the occurrence at `$2` and holds its retry back until now
/// plus `$4` milliseconds. `$1` job, `$3` error, `$5` now.
pub const JOB_FAIL: &str = "UPDATE idem_jobs SET attempts = attempts + 1, error = $3, \
    lease_until = COALESCE($5, {now}) + $4, updated_at = COALESCE($5, {now}) \
    WHERE job = $1 AND next_at = $2 AND (lease_until IS NULL OR lease_until <= COALESCE($5, {now}))";

/// Claims the occurrence at `$2` for a leased run: the next fencing token, the occurrence
/// `$3` running, until now plus the lease `$4`. `$1` job, `$5` now.
pub const JOB_CLAIM: &str = "UPDATE idem_jobs SET fence = fence + 1, running_at = $3, \
    attempts = attempts + 1, lease_until = COALESCE($5, {now}) + $4, \
    updated_at = COALESCE($5, {now}) \
    WHERE job = $1 AND next_at = $2 AND (lease_until IS NULL OR lease_until <= COALESCE($5, {now}))";

/// Extends the lease of a leased run still held (same fence). `$1` job, `$2` fence, `$3`
/// the lease in milliseconds, `$4` now.
pub const JOB_EXTEND: &str = "UPDATE idem_jobs SET lease_until = COALESCE($4, {now}) + $3, \
    updated_at = COALESCE($4, {now}) \
    WHERE job = $1 AND fence = $2 AND running_at IS NOT NULL";

/// Completes a leased run still held (same fence): the first occurrence not yet run moves to
/// `$3`, the last one run is `$4`, with result `$5`. `$1` job, `$2` fence, `$6` now.
pub const JOB_COMPLETE: &str = "UPDATE idem_jobs SET next_at = $3, last_at = $4, result = $5, \
    running_at = NULL, lease_until = NULL, attempts = 0, error = NULL, \
    updated_at = COALESCE($6, {now}) \
    WHERE job = $1 AND fence = $2 AND running_at IS NOT NULL";

/// Records the failure of a leased run still held (same fence), holding its retry back
/// until now plus `$4` milliseconds. `$1` job, `$2` fence, `$3` error, `$5` now.
pub const JOB_FAIL_LEASED: &str = "UPDATE idem_jobs SET running_at = NULL, error = $3, \
    lease_until = COALESCE($5, {now}) + $4, updated_at = COALESCE($5, {now}) \
    WHERE job = $1 AND fence = $2 AND running_at IS NOT NULL";

/// The statements of leases and jobs, as one dialect spells them.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct LeaseSql {
    pub lease_ensure: String,
    pub lease_acquire: String,
    pub lease_read: String,
    pub lease_extend: String,
    pub lease_release: String,
    pub job_ensure: String,
    pub job_read: String,
    pub job_skip: String,
    pub job_occur: String,
    pub job_store: String,
    pub job_fail: String,
    pub job_claim: String,
    pub job_extend: String,
    pub job_complete: String,
    pub job_fail_leased: String,
}

impl LeaseSql {
    fn of(dialect: Dialect) -> LeaseSql {
        let now = dialect.now_millis();
        let spell = |template: &str| template.replace("{now}", now);
        let mysql = dialect == Dialect::MySql;
        LeaseSql {
            lease_ensure: spell(if mysql {
                LEASE_ENSURE_MYSQL
            } else {
                LEASE_ENSURE
            }),
            lease_acquire: spell(LEASE_ACQUIRE),
            lease_read: spell(LEASE_READ),
            lease_extend: spell(LEASE_EXTEND),
            lease_release: spell(LEASE_RELEASE),
            job_ensure: spell(if mysql { JOB_ENSURE_MYSQL } else { JOB_ENSURE }),
            job_read: spell(JOB_READ),
            job_skip: spell(JOB_SKIP),
            job_occur: spell(JOB_OCCUR),
            job_store: JOB_STORE.to_owned(),
            job_fail: spell(JOB_FAIL),
            job_claim: spell(JOB_CLAIM),
            job_extend: spell(JOB_EXTEND),
            job_complete: spell(JOB_COMPLETE),
            job_fail_leased: spell(JOB_FAIL_LEASED),
        }
    }
}

static POSTGRES: LazyLock<LeaseSql> = LazyLock::new(|| LeaseSql::of(Dialect::Postgres));
static SQLITE: LazyLock<LeaseSql> = LazyLock::new(|| LeaseSql::of(Dialect::Sqlite));
static MYSQL: LazyLock<LeaseSql> = LazyLock::new(|| LeaseSql::of(Dialect::MySql));

impl Dialect {
    /// The statements of leases and scheduled jobs as this dialect spells them (built once
    /// per dialect).
    pub fn leases(self) -> &'static LeaseSql {
        match self {
            Dialect::Postgres => &POSTGRES,
            Dialect::Sqlite => &SQLITE,
            Dialect::MySql => &MYSQL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_reads_the_databases_clock_where_it_judges_time() {
        for dialect in [Dialect::Postgres, Dialect::Sqlite, Dialect::MySql] {
            let sql = dialect.leases();
            for statement in [&sql.lease_acquire, &sql.job_claim, &sql.job_occur] {
                assert!(!statement.contains("{now}"), "{statement}");
                assert!(statement.contains(dialect.now_millis()), "{statement}");
            }
        }
        assert!(
            Dialect::MySql
                .leases()
                .lease_ensure
                .contains("ON DUPLICATE KEY")
        );
        assert!(
            Dialect::Postgres
                .leases()
                .job_ensure
                .contains("ON CONFLICT (job)")
        );
    }
}
