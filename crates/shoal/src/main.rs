//! `shoal`, the client: `shoal_cli` and nothing else of this package; every subcommand but `daemon` is a
//! client of the Engine API on the control socket. `shoal daemon ...` executes `shoald` from this binary's
//! folder with the same arguments (and the same `argv[0]`, so the process looks as it did), once they parsed:
//! the daemon is the same process, with its own binary. On the system allocator: a client process
//! allocates little and briefly.

use std::os::unix::process::CommandExt;

fn main() {
    std::process::exit(shoal_cli::main_with(|_checked| exec_daemon()));
}

/// Replaces this process with `shoald` (found next to this binary) given this process's arguments;
/// returns only when that fails, with a message that says where the daemon binary should be.
fn exec_daemon() -> i32 {
    let daemon = match std::env::current_exe() {
        Ok(me) => me.with_file_name("shoald"),
        Err(e) => {
            eprintln!("shoal daemon: cannot tell where this binary is ({e}), so cannot find shoald beside it");
            return 1;
        }
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "shoal".into());
    let err = std::process::Command::new(&daemon).arg0(arg0).args(args).exec();
    eprintln!(
        "shoal daemon: cannot run the daemon binary {}: {err}; `cargo build --release` builds it beside shoal \
         (install both)",
        daemon.display()
    );
    1
}
