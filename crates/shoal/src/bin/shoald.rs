//! `shoald`, the daemon binary: `shoal daemon` executes it (`shoald daemon ...` runs the same); it takes the
//! client commands too. mimalloc for the daemon: its allocation-heavy paths (the store, the scheduler,
//! gRPC) are faster on it than on glibc's malloc, and its options are set by [`mimalloc_setup::set_up`].

#[path = "../mimalloc_setup.rs"]
mod mimalloc_setup;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    mimalloc_setup::set_up();
    std::process::exit(shoal_cli::main_with(shoal::daemon::run));
}
