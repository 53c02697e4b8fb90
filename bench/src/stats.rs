//! Process statistics from /proc, and the mock provider's own counts.

use std::time::Duration;

/// CPU time of a process (utime + stime), from /proc.
pub fn process_cpu(pid: u32) -> Duration {
    stat_cpu(pid, false)
}

/// Field `i` of /proc/<pid>/stat, counted from the one after the command
/// name (the state is 0, the parent pid 1, utime 11).
pub fn stat_field(pid: u32, i: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces: fields start after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(i)?.parse().ok()
}

/// CPU time of a process (`children`: of its waited-for children instead).
/// utime and stime are fields 14 and 15 of the file, cutime and cstime 16
/// and 17; the kernel's USER_HZ is 100 on every Linux this runs on.
pub fn stat_cpu(pid: u32, children: bool) -> Duration {
    let first = if children { 13 } else { 11 };
    let ticks = |i| stat_field(pid, i).unwrap_or(0);
    Duration::from_millis((ticks(first) + ticks(first + 1)) * 10)
}

/// CPU time of a process and of all its live descendants (uvicorn's
/// workers are children of its supervisor).
pub fn tree_cpu(pid: u32) -> Duration {
    let mut total = stat_cpu(pid, false);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return total;
    };
    let children: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| stat_field(*p, 1) == Some(u64::from(pid)))
        .collect();
    for child in children {
        total += tree_cpu(child);
    }
    total
}

/// (busy, total) jiffies of the whole machine.
pub fn machine_cpu() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// CPU time of the Postgres server: every process named `postgres`, plus
/// what the postmaster reaped from backends that already exited (pgbench's
/// backends exit before the end of the floor can be read).
pub fn postgres_cpu() -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    let is_postgres = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres")
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| is_postgres(*pid))
        .map(|pid| {
            let postmaster = stat_field(pid, 1).is_some_and(|ppid| !is_postgres(ppid as u32));
            stat_cpu(pid, false)
                + if postmaster {
                    stat_cpu(pid, true)
                } else {
                    Duration::ZERO
                }
        })
        .sum()
}

/// A `kB` field of /proc/<pid>/status (e.g. `VmHWM:`).
pub fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The mock provider's `GET /stats` on 127.0.0.1:`port`.
pub async fn mock_stats(client: &reqwest::Client, port: u16) -> Result<serde_json::Value, String> {
    client
        .get(format!("http://127.0.0.1:{port}/stats"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())
}
