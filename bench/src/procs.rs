//! The processes a run starts: `sendonce` and `mock-provider` from one
//! directory, on free loopback ports, and waiting for them to be ready.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A free loopback port (free when asked: the caller binds it soon after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Where `sendonce` and `mock-provider` are: `given`, else the directory of
/// the running binary (cargo puts them all in target/<profile>/). Fails if
/// either is missing; `hint` says how to build them.
pub fn bin_dir(given: Option<&Path>, hint: &str) -> Result<PathBuf, String> {
    let dir = match given {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .parent()
            .ok_or("no binary directory")?
            .to_path_buf(),
    };
    for bin in ["sendonce", "mock-provider"] {
        if !dir.join(bin).exists() {
            return Err(format!(
                "{bin} not found in {}: build it first{hint}",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

/// A directory for the run's logs under the temporary directory.
pub fn log_dir(what: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("sendonce-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// `mock-provider` on 127.0.0.1:`port`, quiet, killed with its handle;
/// `env` adds its fault settings.
pub fn spawn_mock(bin_dir: &Path, port: u16, env: &[(&str, String)]) -> Result<Child, String> {
    let mut cmd = Command::new(bin_dir.join("mock-provider"));
    cmd.env("MOCK_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start mock-provider: {e}"))
}

/// Waits up to 30 s for `{base}{path}` to answer 2xx; fails at once if
/// `child` (when given) exits first.
pub async fn wait_ready(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    mut child: Option<&mut Child>,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(c) = child.as_deref_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return Err(format!("exited early with {status}"));
        }
        if let Ok(r) = client.get(format!("{base}{path}")).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{path} not ready within 30 s"))
}

/// Runs `cmd` (a `sendonce` command line) with `migrate`.
pub async fn migrate(mut cmd: Command) -> Result<(), String> {
    let out = cmd
        .arg("migrate")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .map_err(|e| format!("sendonce migrate: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sendonce migrate: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// SIGKILLs `child` and reaps it.
pub async fn kill(child: &mut Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Stops `child` with SIGTERM (a graceful stop: a process under a profiler
/// writes its profile), waiting up to `grace` before a SIGKILL.
pub async fn terminate(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    kill(child).await;
}
