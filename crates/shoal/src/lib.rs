//! The `shoal` package: the two binaries, as `docker` and `dockerd`. `shoal` (src/main.rs), the client, is
//! `shoal_cli` and nothing else: it checks `shoal daemon`'s flags and runs it by executing `shoald`, and links
//! none of the daemon (no Raft, store, TLS or OpenSSL), so it starts in a fraction of the daemon's time, which
//! is what a script creating services one process at a time waits on (BENCHMARKS.md, "Two binaries").
//! `shoald` (src/bin/shoald.rs), the daemon, parses the same command line (`shoal_cli`) and runs the daemon
//! (`daemon`, this library).

pub mod daemon;
