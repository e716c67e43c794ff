//! The load generator's split placement (benches/lockbench/placement.rs):
//! the bench target has no test harness, so this test crate includes the
//! file. A real child process is pinned and let go, and its affinity is
//! read back from /proc; and the rule of which rows judge the CPU goals.

#![cfg(target_os = "linux")]

#[allow(dead_code)]
#[path = "../benches/lockbench/placement.rs"]
mod placement;

use std::process::{Child, Command};

/// `Cpus_allowed_list` of a process, as /proc/PID/status gives it.
fn allowed(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string()
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_split_pins_the_server_and_this_process_apart_the_standby_beside_it_and_lets_all_go() {
    let Some(split) = placement::Split::of_this_machine() else {
        eprintln!("one CPU: nothing to split");
        return;
    };
    let child = Kill(Command::new("sleep").arg("30").spawn().expect("sleep"));
    let standby = Kill(Command::new("sleep").arg("30").spawn().expect("sleep"));
    let (pid, other) = (child.0.id(), standby.0.id());
    let before_child = allowed(pid);
    let before_other = allowed(other);
    let before_me = allowed(std::process::id());
    {
        let _pinned = split.apply(&[pid], &[other]).expect("pin");
        let servers = split.describe();
        let want_server = servers.split(" | ").nth(1).expect("servers");
        let server_cpus = want_server
            .trim_start_matches("CPUs ")
            .trim_start_matches("CPU ");
        assert_eq!(allowed(pid), server_cpus);
        assert_eq!(allowed(std::process::id()), split.load_gen[0].to_string());
        assert_eq!(
            allowed(other),
            split.load_gen[0].to_string(),
            "a standby runs beside the load generator"
        );
    }
    assert_eq!(allowed(pid), before_child, "the server is let go");
    assert_eq!(allowed(other), before_other, "the standby is let go");
    assert_eq!(
        allowed(std::process::id()),
        before_me,
        "and so is the load generator"
    );
}

#[test]
fn the_cpu_goals_are_judged_on_the_split_rows_and_on_the_shared_ones_only_without_them() {
    // A run with split rows: they judge, the shared rows are shown.
    assert!(placement::judges_cpu_goals(true, true));
    assert!(!placement::judges_cpu_goals(false, true));
    // A run without (one CPU): the shared rows judge.
    assert!(placement::judges_cpu_goals(false, false));
}
