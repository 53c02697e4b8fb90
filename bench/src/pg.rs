//! A throwaway Postgres cluster of the run's own (initdb + pg_ctl in a
//! temporary directory, on a free port), so that `chaos --restart-postgres`
//! restarts that cluster and nothing else on the machine. As root it runs
//! the server as user `postgres` (initdb refuses root), as scripts/test.sh
//! does.
//!
//! `chaos --clock-step` runs it under a clock of its own
//! ([`Cluster::start_with_fake_clock`]): Debian's libfaketime preloaded into
//! the server, reading its offset from a file the run rewrites to step the
//! database's wall clock (`now()`, `clock_timestamp()`), the monotonic
//! clocks left alone.

use std::path::{Path, PathBuf};
use std::process::Stdio;

/// One of the machine's Postgres programs: on PATH, else the newest
/// /usr/lib/postgresql/<version>/bin (Debian's layout).
pub fn find_pg_bin(name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join(name).is_file() {
                return Some(dir.join(name));
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin").join(name);
            bin.is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Where Debian's libfaketime is (package `libfaketime`): the first
/// `/usr/lib/<triplet>/faketime/libfaketime.so.1`, or `/usr/lib/faketime/...`.
pub fn find_libfaketime() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .map(|e| e.path().join("faketime"))
        .collect();
    dirs.sort();
    dirs.push(PathBuf::from("/usr/lib/faketime"));
    dirs.into_iter()
        .map(|d| d.join("libfaketime.so.1"))
        .find(|p| p.is_file())
}

/// A cluster in `dir` (data in `dir/data`, socket and log in `dir`).
pub struct Cluster {
    dir: PathBuf,
    pg_ctl: PathBuf,
    port: u16,
    as_postgres: bool,
    running: bool,
    /// Set in the server's environment (the fake clock's variables).
    env: Vec<(String, String)>,
    /// The fake clock's offset file (with a fake clock).
    clock_file: Option<PathBuf>,
}

/// The command line of `pg_ctl <action>` for the cluster in `dir` on `port`:
/// it names that data directory and nothing else (no pg_ctlcluster, which
/// acts on the machine's clusters). As root, it runs as user `postgres`.
pub fn pg_ctl_command(
    pg_ctl: &Path,
    dir: &Path,
    port: u16,
    action: &str,
    as_postgres: bool,
) -> Vec<String> {
    pg_ctl_command_with_env(pg_ctl, dir, port, action, as_postgres, &[])
}

/// [`pg_ctl_command`] with `env` set for pg_ctl and so for the server it
/// starts (through `env(1)`, after `runuser`: set for the server's user,
/// whatever `runuser` keeps of the caller's environment).
pub fn pg_ctl_command_with_env(
    pg_ctl: &Path,
    dir: &Path,
    port: u16,
    action: &str,
    as_postgres: bool,
    env: &[(String, String)],
) -> Vec<String> {
    let mut argv = Vec::new();
    if as_postgres {
        argv.extend(["runuser", "-u", "postgres", "--"].map(String::from));
    }
    if !env.is_empty() {
        argv.push("env".into());
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    }
    argv.push(pg_ctl.display().to_string());
    argv.extend(["-D".into(), dir.join("data").display().to_string()]);
    argv.extend(["-l".into(), dir.join("log").display().to_string()]);
    argv.extend(["-w".into(), "-m".into(), "fast".into()]);
    if action != "stop" {
        argv.push("-o".into());
        argv.push(format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off",
            dir.display()
        ));
    }
    argv.push(action.into());
    argv
}

/// How far (seconds) the database's wall clock (`now()`) is
/// ahead of this machine's, read halfway through the query.
pub async fn clock_ahead(conn: &mut sqlx::PgConnection) -> Result<f64, String> {
    let epoch = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let before = epoch();
    let db: f64 = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
        .fetch_one(conn)
        .await
        .map_err(|e| format!("read the database's clock: {e}"))?;
    let after = epoch();
    Ok(db - (before + after) / 2.0)
}

/// Writes libfaketime's offset file (`+30s`, ...) through a rename, readable
/// by the server's user.
fn write_clock_file(file: &Path, offset: &str) -> Result<(), String> {
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, format!("{offset}\n")).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, file).map_err(|e| format!("{}: {e}", file.display()))
}

fn run_blocking(argv: &[String]) -> Result<(), String> {
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

impl Cluster {
    /// initdb and start a cluster on a free port in a new temporary directory.
    pub fn start() -> Result<Cluster, String> {
        Cluster::start_inner(None)
    }

    /// As [`Cluster::start`], with the server under a fake wall clock:
    /// `libfaketime` (the path of `libfaketime.so.1`) preloaded, its offset
    /// read from a file in the cluster's directory on every clock read
    /// (`FAKETIME_NO_CACHE`), monotonic clocks real. The offset starts at
    /// 0; [`Cluster::set_clock_offset`] steps it.
    pub fn start_with_fake_clock(libfaketime: &Path) -> Result<Cluster, String> {
        Cluster::start_inner(Some(libfaketime))
    }

    fn start_inner(libfaketime: Option<&Path>) -> Result<Cluster, String> {
        let initdb =
            find_pg_bin("initdb").ok_or("initdb not found (apt-get install postgresql)")?;
        let pg_ctl = find_pg_bin("pg_ctl").ok_or("pg_ctl not found")?;
        let port = crate::procs::free_port().map_err(|e| e.to_string())?;
        let dir = std::env::temp_dir().join(format!(
            "sendonce-chaos-pg-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // Root? (`id -u`: no libc call, no unsafe.)
        let as_postgres = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let mut cluster = Cluster {
            dir,
            pg_ctl,
            port,
            as_postgres,
            running: false,
            env: Vec::new(),
            clock_file: None,
        };
        if as_postgres {
            run_blocking(&[
                "chown".into(),
                "postgres".into(),
                cluster.dir.display().to_string(),
            ])?;
        }
        if let Some(lib) = libfaketime {
            let file = cluster.dir.join("faketime");
            write_clock_file(&file, "+0")?;
            cluster.env = vec![
                ("LD_PRELOAD".into(), lib.display().to_string()),
                ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
                ("FAKETIME_NO_CACHE".into(), "1".into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
            ];
            cluster.clock_file = Some(file);
        }
        let mut argv = Vec::new();
        if as_postgres {
            argv.extend(["runuser", "-u", "postgres", "--"].map(String::from));
        }
        argv.push(initdb.display().to_string());
        argv.extend(["-D".into(), cluster.dir.join("data").display().to_string()]);
        argv.extend(["-U", "postgres", "--auth=trust", "-E", "UTF8"].map(String::from));
        run_blocking(&argv)?;
        run_blocking(&cluster.command("start"))?;
        cluster.running = true;
        Ok(cluster)
    }

    fn command(&self, action: &str) -> Vec<String> {
        pg_ctl_command_with_env(
            &self.pg_ctl,
            &self.dir,
            self.port,
            action,
            self.as_postgres,
            &self.env,
        )
    }

    /// Whether the server runs under a fake clock.
    pub fn has_fake_clock(&self) -> bool {
        self.clock_file.is_some()
    }

    /// Sets the fake clock `secs` ahead of the machine's (behind if
    /// negative): the server's next clock read sees it. The file is
    /// replaced whole (a rename), so a read never sees half of it.
    pub fn set_clock_offset(&self, secs: i64) -> Result<(), String> {
        let file = self
            .clock_file
            .as_ref()
            .ok_or("this cluster has no fake clock")?;
        write_clock_file(file, &format!("{secs:+}s"))
    }

    /// The admin URL of the cluster's `postgres` database.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restarts this cluster (fast shutdown: connections are cut).
    pub async fn restart(&self) -> bool {
        let argv = self.command("restart");
        tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Cluster {
    /// Stops the cluster and removes its directory.
    fn drop(&mut self) {
        if self.running {
            let _ = run_blocking(&self.command("stop"));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_command_names_only_the_clusters_own_data_directory() {
        let dir = Path::new("/tmp/sendonce-chaos-pg-1");
        let argv = pg_ctl_command(Path::new("/usr/bin/pg_ctl"), dir, 54321, "restart", false);
        assert_eq!(argv[0], "/usr/bin/pg_ctl");
        let d = argv.iter().position(|a| a == "-D").unwrap();
        assert_eq!(argv[d + 1], "/tmp/sendonce-chaos-pg-1/data");
        assert_eq!(argv.last().map(String::as_str), Some("restart"));
        assert!(argv.iter().any(|a| a.starts_with("-p 54321 ")));
        assert!(!argv.iter().any(|a| a.contains("pg_ctlcluster")));
    }

    #[test]
    fn the_fake_clock_reaches_the_server_through_env_after_runuser() {
        let env = [(
            "LD_PRELOAD".to_string(),
            "/lib/libfaketime.so.1".to_string(),
        )];
        let argv =
            pg_ctl_command_with_env(Path::new("pg_ctl"), Path::new("/d"), 1, "start", true, &env);
        assert_eq!(
            argv[..7],
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                "env",
                "LD_PRELOAD=/lib/libfaketime.so.1",
                "pg_ctl"
            ]
        );
    }

    #[test]
    fn as_root_it_runs_as_postgres() {
        let argv = pg_ctl_command(Path::new("pg_ctl"), Path::new("/d"), 1, "stop", true);
        assert_eq!(argv[..5], ["runuser", "-u", "postgres", "--", "pg_ctl"]);
        assert!(!argv.iter().any(|a| a == "-o"));
    }

    /// Starts a real cluster (when Postgres is installed), restarts it and
    /// checks it answers again on its own port.
    #[tokio::test]
    async fn a_throwaway_cluster_starts_restarts_and_answers() {
        use sqlx::Connection;
        if find_pg_bin("initdb").is_none() {
            eprintln!("SKIPPED: no initdb on this machine");
            return;
        }
        let cluster = Cluster::start().unwrap();
        let url = cluster.admin_url();
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let before: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(cluster.restart().await);
        // The old connection is gone with the restart; a new one works.
        assert!(sqlx::query("SELECT 1").execute(&mut conn).await.is_err());
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        let after: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_ne!(before, after);
    }

    /// Starts a real cluster under the fake clock (when Postgres and
    /// libfaketime are installed), steps it and checks `now()` moved.
    #[tokio::test]
    async fn a_fake_clock_steps_the_servers_now() {
        use sqlx::Connection;
        let (Some(_), Some(lib)) = (find_pg_bin("initdb"), find_libfaketime()) else {
            eprintln!("SKIPPED: no initdb or no libfaketime on this machine");
            return;
        };
        let cluster = Cluster::start_with_fake_clock(&lib).unwrap();
        let mut conn = sqlx::PgConnection::connect(&cluster.admin_url())
            .await
            .unwrap();
        assert!(clock_ahead(&mut conn).await.unwrap().abs() < 2.0);
        cluster.set_clock_offset(30).unwrap();
        let ahead = clock_ahead(&mut conn).await.unwrap();
        assert!((ahead - 30.0).abs() < 2.0, "{ahead}");
        cluster.set_clock_offset(90).unwrap();
        let ahead = clock_ahead(&mut conn).await.unwrap();
        assert!((ahead - 90.0).abs() < 2.0, "{ahead}");
    }
}
