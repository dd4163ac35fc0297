//! The seeded runner: a target over its corpus, then over inputs mutated from it, each call guarded by
//! `catch_unwind`, timed and (with an `AllocProbe`) its allocations measured. A failing input is written to a file (its
//! path and the seed are in the error) so that `replay` (or `SHOAL_FUZZ_REPLAY=<file>` in the test) runs exactly it
//! again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::mutate::mutate;
use crate::Target;

/// Longest a single input may take before the run counts it as a hang (debug build, shared machine).
pub const MAX_INPUT_TIME: Duration = Duration::from_secs(5);

/// Most bytes one input may have allocated at once (beyond what was live before it): an input that needs
/// more makes a decoder allocate without bound (inputs are at most 64 KiB).
pub const MAX_INPUT_ALLOC_BYTES: usize = 256 << 20;

/// A window on the process's allocator, when the caller installed a counting one: `reset` starts a
/// measurement, `peak_bytes` says the most bytes live at once since, above what was live at `reset`.
#[derive(Clone, Copy)]
pub struct AllocProbe {
    /// Starts a measurement.
    pub reset: fn(),
    /// The peak since `reset`.
    pub peak_bytes: fn() -> usize,
}

/// How a run ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStats {
    /// Corpus inputs run.
    pub corpus: usize,
    /// Mutated inputs run.
    pub mutated: usize,
    /// Slowest input.
    pub slowest: Duration,
    /// Most bytes one input allocated at once (0 without a probe).
    pub peak_alloc_bytes: usize,
}

/// The corpus files of `target` under `corpus_root`, sorted by name (the order is part of the replay).
pub fn corpus(corpus_root: &Path, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_root.join(target);
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("read corpus file {}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// Runs `target` once on `input`: its time and peak allocation, or the panic message, a hang or an
/// allocation beyond `MAX_INPUT_ALLOC_BYTES` as an error.
pub fn run_one(target: &Target, input: &[u8], probe: Option<AllocProbe>) -> Result<(Duration, usize), String> {
    if let Some(p) = probe {
        (p.reset)();
    }
    let start = Instant::now();
    let result = std::panic::catch_unwind(|| (target.run)(input));
    let took = start.elapsed();
    let peak = probe.map(|p| (p.peak_bytes)()).unwrap_or(0);
    match result {
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            Err(format!("panicked: {msg}"))
        }
        Ok(()) if took > MAX_INPUT_TIME => Err(format!("took {took:?} (more than {MAX_INPUT_TIME:?}): a hang")),
        Ok(()) if peak > MAX_INPUT_ALLOC_BYTES => Err(format!(
            "allocated {peak} bytes at once from a {}-byte input (more than {MAX_INPUT_ALLOC_BYTES})",
            input.len()
        )),
        Ok(()) => Ok((took, peak)),
    }
}

/// Runs `target` over its corpus, then over mutated inputs from `seed` until `iterations` ran or `budget`
/// passed. A failure writes the input under `failures_dir` and says which file, the seed and the iteration.
pub fn run(
    target: &Target,
    probe: Option<AllocProbe>,
    corpus_root: &Path,
    failures_dir: &Path,
    seed: u64,
    iterations: usize,
    budget: Duration,
) -> Result<RunStats, String> {
    let inputs = corpus(corpus_root, target.name);
    let fail = |what: &str, input: &[u8], err: String| -> String {
        std::fs::create_dir_all(failures_dir).expect("create the failures directory");
        let path = failures_dir.join(format!("{}-{seed}-{what}.bin", target.name));
        std::fs::write(&path, input).expect("write the failing input");
        format!(
            "target {} failed on {what} (seed {seed}): {err}\n  input saved to {}\n  replay: SHOAL_FUZZ_TARGET={} \
             SHOAL_FUZZ_REPLAY={} cargo nextest run -p shoal-fuzz --run-ignored only replay",
            target.name,
            path.display(),
            target.name,
            path.display()
        )
    };
    let mut stats = RunStats { corpus: 0, mutated: 0, slowest: Duration::ZERO, peak_alloc_bytes: 0 };
    for (path, input) in &inputs {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (took, peak) = run_one(target, input, probe).map_err(|e| fail(&format!("corpus-{name}"), input, e))?;
        stats.corpus += 1;
        stats.slowest = stats.slowest.max(took);
        stats.peak_alloc_bytes = stats.peak_alloc_bytes.max(peak);
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let start = Instant::now();
    let empty = Vec::new();
    for i in 0..iterations {
        if start.elapsed() > budget {
            break;
        }
        let base = if inputs.is_empty() { &empty } else { &inputs[rng.random_range(0..inputs.len())].1 };
        let other = if inputs.is_empty() { &empty } else { &inputs[rng.random_range(0..inputs.len())].1 };
        let input = mutate(base, other, target.dictionary, &mut rng);
        let (took, peak) = run_one(target, &input, probe).map_err(|e| fail(&format!("iter{i}"), &input, e))?;
        stats.mutated += 1;
        stats.slowest = stats.slowest.max(took);
        stats.peak_alloc_bytes = stats.peak_alloc_bytes.max(peak);
    }
    Ok(stats)
}
