//! What a test needs from the machine (the docker CLI, a Docker Engine, cfssl), and what happens when it is
//! missing: the test fails, saying what to install, so a CI machine without it fails loudly instead of passing
//! tests that ran nothing (`.ci/run` installs every prerequisite). A developer whose machine lacks one on
//! purpose names it in `SHOAL_TEST_SKIP_MISSING` (a comma-separated list of the names below, or `all`): those
//! tests then print that they were skipped and return.
//!
//! Must not depend on anything but the environment and the commands it probes.

use std::process::Command;

/// The environment variable that lets tests skip when a named prerequisite is missing.
pub const SKIP_MISSING_ENV: &str = "SHOAL_TEST_SKIP_MISSING";

/// A prerequisite a test can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prerequisite {
    /// The stock `docker` CLI (client only).
    DockerCli,
    /// A Docker Engine answering on the machine's default socket (and the CLI).
    DockerEngine,
    /// The engine's daemon binary `/usr/sbin/dockerd` (a second engine started by a test) and a running engine.
    Dockerd,
    /// CFSSL's `cfssl` (the external CA test's signer).
    Cfssl,
    /// A docker CLI of Docker 23 or later: the cluster-volume flags (`docker volume create --type/--scope/
    /// --sharing/--topology-required`, `--mount type=cluster`).
    DockerCli23,
}

impl Prerequisite {
    /// The name `SHOAL_TEST_SKIP_MISSING` lists it by.
    pub fn name(self) -> &'static str {
        match self {
            Prerequisite::DockerCli => "docker-cli",
            Prerequisite::DockerEngine => "docker-engine",
            Prerequisite::Dockerd => "dockerd",
            Prerequisite::Cfssl => "cfssl",
            Prerequisite::DockerCli23 => "docker-cli-23",
        }
    }

    /// How to get it on Debian.
    fn install(self) -> &'static str {
        match self {
            Prerequisite::DockerCli => "apt-get install docker.io (the CLI)",
            Prerequisite::DockerEngine => "apt-get install docker.io and start dockerd",
            Prerequisite::Dockerd => "apt-get install docker.io (dockerd at /usr/sbin/dockerd) and start it",
            Prerequisite::Cfssl => "apt-get install golang-cfssl",
            Prerequisite::DockerCli23 => {
                "a docker CLI of version 23 or later first on PATH (our machines have 28.2 in /usr/local/bin; \
                 Debian 12's docker.io is 20.10, Debian 13's docker-cli is 26)"
            }
        }
    }

    /// Whether this machine has it.
    pub fn present(self) -> bool {
        match self {
            Prerequisite::DockerCli => crate::docker_cli::available(),
            Prerequisite::DockerEngine => engine_answers(),
            Prerequisite::Dockerd => engine_answers() && std::path::Path::new("/usr/sbin/dockerd").exists(),
            Prerequisite::Cfssl => Command::new("cfssl").arg("version").output().is_ok_and(|o| o.status.success()),
            Prerequisite::DockerCli23 => Command::new("docker")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success() && cli_major(&String::from_utf8_lossy(&o.stdout)) >= Some(23)),
        }
    }
}

/// Whether the running test should skip: false when `p` is present; when it is missing, true if
/// `SHOAL_TEST_SKIP_MISSING` names it (printing that the test was skipped), and otherwise a panic that says what
/// to install.
pub fn skip_unless(p: Prerequisite) -> bool {
    if p.present() {
        return false;
    }
    decide_missing(p, std::env::var(SKIP_MISSING_ENV).ok().as_deref())
}

/// The decision for a missing prerequisite, given the value of `SHOAL_TEST_SKIP_MISSING`.
fn decide_missing(p: Prerequisite, allowed: Option<&str>) -> bool {
    let listed = allowed.is_some_and(|v| v.split(',').map(str::trim).any(|n| n == "all" || n == p.name()));
    if listed {
        eprintln!("skipped: {} is missing on this machine ({SKIP_MISSING_ENV} lists it)", p.name());
        return true;
    }
    panic!(
        "this test needs {} and this machine has none: {} (.ci/run installs it), or set {SKIP_MISSING_ENV}={} to \
         skip such tests on purpose",
        p.name(),
        p.install(),
        p.name()
    );
}

/// The major version in `docker --version`'s "Docker version 28.2.2, build e6534b4".
fn cli_major(said: &str) -> Option<u32> {
    said.strip_prefix("Docker version ")?.split('.').next()?.trim().parse().ok()
}

/// True when the docker CLI is installed and the local engine (not a `DOCKER_HOST` of the caller's) answers.
fn engine_answers() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .env_remove("DOCKER_HOST")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_s_major_version_is_read_from_its_version_line() {
        assert_eq!(cli_major("Docker version 28.2.2, build e6534b4\n"), Some(28));
        assert_eq!(cli_major("Docker version 20.10.24+dfsg1, build 297e128"), Some(20));
        assert_eq!(cli_major("podman version 4.3.1"), None);
    }

    #[test]
    fn a_missing_prerequisite_skips_only_when_named() {
        assert!(decide_missing(Prerequisite::Cfssl, Some("cfssl")));
        assert!(decide_missing(Prerequisite::Cfssl, Some("docker-cli, cfssl")));
        assert!(decide_missing(Prerequisite::DockerEngine, Some("all")));
        for allowed in [None, Some(""), Some("docker-cli"), Some("cfssl-x")] {
            let r = std::panic::catch_unwind(|| decide_missing(Prerequisite::Cfssl, allowed));
            let msg = r.expect_err("a missing prerequisite not named must fail the test");
            let msg = msg.downcast_ref::<String>().expect("panic message");
            assert!(msg.contains("apt-get install golang-cfssl") && msg.contains(SKIP_MISSING_ENV), "{msg}");
        }
    }
}
