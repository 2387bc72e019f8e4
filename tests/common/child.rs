//! A child process running one ignored test of the current test binary, for the crash
//! tests: the parent reads the steps it prints (`idem-child: …` lines on stdout) and kills
//! it with SIGKILL where it stands.
//!
//! Include it next to `mod common;` with `#[path = "common/child.rs"] mod child;`.

#![allow(dead_code)]

use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What a child prints before each step the parent reads.
pub const PREFIX: &str = "idem-child: ";

/// Prints a step for the parent (flushed at once: the next thing may be a SIGKILL).
pub fn report(step: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{PREFIX}{step}").unwrap();
    out.flush().unwrap();
}

/// The point a child stops at (see [`stop_at`]).
static TARGET: std::sync::OnceLock<idem::fault::FaultPoint> = std::sync::OnceLock::new();

/// Installs the child's fault hook, once: it reports each point the child passes
/// (`point <name>`) and, at `target`, reports `crash-point <name>` and blocks until the
/// parent kills it, so the kill lands exactly there.
pub fn stop_at(target: idem::fault::FaultPoint) {
    fn hook(point: idem::fault::FaultPoint) {
        if TARGET.get() == Some(&point) {
            report(&format!("crash-point {}", point.name()));
            loop {
                std::thread::park();
            }
        }
        report(&format!("point {}", point.name()));
    }
    TARGET.set(target).expect("one crash point per child");
    assert!(idem::fault::set_hook(hook), "a fault hook was already set");
}

/// Installs the child's fault hook, once: at the `n`-th time any call of the process passes
/// `target` (from 1), it reports `crash-point <name>` and blocks until the parent kills it;
/// it reports nothing else (a long run passes the points thousands of times).
pub fn stop_at_nth(target: idem::fault::FaultPoint, n: u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PASSED: AtomicU64 = AtomicU64::new(0);
    static NTH: AtomicU64 = AtomicU64::new(0);
    fn hook(point: idem::fault::FaultPoint) {
        if TARGET.get() == Some(&point)
            && PASSED.fetch_add(1, Ordering::SeqCst) + 1 == NTH.load(Ordering::SeqCst)
        {
            report(&format!("crash-point {}", point.name()));
            loop {
                std::thread::park();
            }
        }
    }
    NTH.store(n, Ordering::SeqCst);
    TARGET.set(target).expect("one crash point per child");
    assert!(idem::fault::set_hook(hook), "a fault hook was already set");
}

/// Installs the child's fault hook, once: at the `n`-th time the process passes `target`
/// (from 1), it reports `pause-point <name>` and waits there until the file `release`
/// exists, then goes on (the parent freezes it meanwhile, or lets the others overtake it).
pub fn pause_at_nth(target: idem::fault::FaultPoint, n: u64, release: std::path::PathBuf) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PASSED: AtomicU64 = AtomicU64::new(0);
    static NTH: AtomicU64 = AtomicU64::new(0);
    static RELEASE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    fn hook(point: idem::fault::FaultPoint) {
        if TARGET.get() == Some(&point)
            && PASSED.fetch_add(1, Ordering::SeqCst) + 1 == NTH.load(Ordering::SeqCst)
        {
            report(&format!("pause-point {}", point.name()));
            let release = RELEASE.get().expect("a release file");
            while !release.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
            report("released");
        }
    }
    NTH.store(n, Ordering::SeqCst);
    RELEASE.set(release).expect("one release file per child");
    TARGET.set(target).expect("one pause point per child");
    assert!(idem::fault::set_hook(hook), "a fault hook was already set");
}

/// A running child process, killed when dropped (a failed test leaves none behind).
pub struct ChildProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

/// How long [`ChildProcess::step`] waits for the child's next step.
const STEP_WAIT: Duration = Duration::from_secs(180);

impl ChildProcess {
    /// Runs the ignored test `test` of this binary, alone, with `env` set (and each
    /// variable of `unset` removed, so the parent's own settings do not leak in).
    pub fn spawn(test: &str, env: &[(&str, String)], unset: &[&str]) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([test, "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1", "-q"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        for name in unset {
            command.env_remove(name);
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(step) = line.strip_prefix(PREFIX) {
                    eprintln!("child {line}");
                    if sender.send(step.to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        ChildProcess { child, lines }
    }

    /// The next step the child prints; it must start with `prefix`. The wait is only a
    /// bound for a child that hangs, so it is generous: a step comes as soon as the child
    /// gets there, but a child sharing two cores with other tests' processes (several SQLite
    /// writers on one machine take turns on the file lock) may need far longer than alone.
    pub async fn step(&mut self, prefix: &str) -> String {
        let step = tokio::time::timeout(STEP_WAIT, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("the child printed no `{prefix}` within {STEP_WAIT:?}"))
            .unwrap_or_else(|| panic!("the child exited before `{prefix}`"));
        assert!(
            step.starts_with(prefix),
            "expected `{prefix}…`, got `{step}`"
        );
        step
    }

    /// SIGKILL: no destructor, no rollback, no close; the OS drops its sockets and locks.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9), "not killed by SIGKILL: {status}");
    }

    /// SIGSTOP: the whole process freezes where it stands, its client libraries' background
    /// threads (heartbeats) with it, until [`thaw`](Self::thaw).
    pub fn freeze(&mut self) {
        self.signal("STOP");
    }

    /// SIGCONT: a frozen child goes on.
    pub fn thaw(&mut self) {
        self.signal("CONT");
    }

    fn signal(&mut self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed: {status}");
    }

    /// Waits (up to 30 s) for the child to exit, successfully.
    pub async fn exits_successfully(mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "the child failed: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "the child did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
