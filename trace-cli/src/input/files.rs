//! What a path on the command line names: one trace file, a directory of them, or the stem of a
//! run's rank files (`trace.ndjson` for `trace.rank0.ndjson`, `trace.rank1.ndjson`, ...), and
//! whether those files are the ranks of one run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use trace_runtime::{TraceHeader, TraceReader};

use super::InputError;

/// The extension of the trace files a directory is searched for.
const TRACE_EXTENSION: &str = "ndjson";

/// One trace file and its header.
#[derive(Debug)]
pub(crate) struct TraceFile {
    pub(crate) path: PathBuf,
    pub(crate) header: TraceHeader,
}

impl TraceFile {
    /// `rank 1` or the file's name, for messages about one of several.
    pub(crate) fn label(&self) -> String {
        match self.header.rank {
            Some(rank) => format!("rank {rank}"),
            None => self.path.display().to_string(),
        }
    }
}

/// The trace files of one run: one file, or the files of its ranks in rank order.
#[derive(Debug)]
pub(crate) struct TraceRun {
    /// What the command line said, for messages.
    pub(crate) label: String,
    pub(crate) files: Vec<TraceFile>,
    /// Ranks of the run with no file among these (a rank that failed, or a file left out).
    pub(crate) missing_ranks: Vec<usize>,
}

impl TraceRun {
    /// The run that `paths` name together: every file of each path (see [`files`]) must
    /// belong to one run, as its ranks; a single file is a run by itself.
    pub(crate) fn open(paths: &[PathBuf]) -> Result<Self, InputError> {
        let mut named = Vec::new();
        for path in paths {
            named.extend(files(path)?);
        }
        let label = match paths {
            [one] => one.display().to_string(),
            _ => paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" + "),
        };
        let mut files = Vec::with_capacity(named.len());
        for path in named {
            if files.iter().any(|f: &TraceFile| f.path == path) {
                continue;
            }
            let header = open_header(&path)?;
            files.push(TraceFile { path, header });
        }
        let missing_ranks = check_one_run(&label, &mut files)?;
        Ok(Self {
            label,
            files,
            missing_ranks,
        })
    }

    /// The first file's header: what the ranks share (the program, its tracepoints, the
    /// configuration).
    pub(crate) fn header(&self) -> &TraceHeader {
        &self.files[0].header
    }

    /// The index of `file`, one of the run's, among its files.
    pub(crate) fn index_of(&self, file: &TraceFile) -> usize {
        (self.files.iter())
            .position(|f| std::ptr::eq(f, file))
            .unwrap_or(0)
    }

    /// Whether it is several ranks' files.
    pub(crate) fn is_ranked(&self) -> bool {
        self.files.len() > 1 || self.header().rank.is_some()
    }

    /// Says on stderr which ranks have no file, once.
    pub(crate) fn warn_missing_ranks(&self) {
        if self.missing_ranks.is_empty() {
            return;
        }
        let world = self.header().world_size.unwrap_or(0);
        let ranks: Vec<String> = self.missing_ranks.iter().map(ToString::to_string).collect();
        eprintln!(
            "model-trace: warning: {}: no file for rank {} of the run's {world} ranks: what they \
             recorded is missing",
            self.label,
            ranks.join(", ")
        );
    }
}

/// The trace files a path names: the file itself; every `*.ndjson` directly in a directory; or,
/// for a path that does not exist, the rank files written for it (`STEM.rank{r}.EXT`).
pub(crate) fn files(path: &Path) -> Result<Vec<PathBuf>, InputError> {
    if path.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| format!("{}: cannot list the directory: {e}", path.display()))?;
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", path.display()))?;
            let file = entry.path();
            if file.is_file() && file.extension().is_some_and(|e| e == TRACE_EXTENSION) {
                found.push(file);
            }
        }
        if found.is_empty() {
            return Err(format!(
                "{}: a directory with no trace files (*.{TRACE_EXTENSION}) in it",
                path.display()
            ));
        }
        found.sort_by_key(|p| rank_order(p));
        return Ok(found);
    }
    if path.exists() {
        return Ok(vec![path.to_path_buf()]);
    }
    let ranks = rank_files(path);
    if ranks.is_empty() {
        return Err(format!(
            "{}: no such file, directory, or run written for it (rank files {})",
            path.display(),
            rank_pattern(path)
        ));
    }
    Ok(ranks)
}

/// `STEM.rank{r}.EXT` beside `path` (`dir/STEM.EXT`), in rank order.
fn rank_files(path: &Path) -> Vec<PathBuf> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(usize, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let rank = rank_of(path, name.to_str()?)?;
            Some((rank, dir.join(name)))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The rank `name` is a rank file of `requested` for: `STEM.rank{r}.EXT` (`STEM.rank{r}`
/// without an extension).
fn rank_of(requested: &Path, name: &str) -> Option<usize> {
    let stem = requested.file_stem()?.to_str()?;
    let rest = name.strip_prefix(stem)?.strip_prefix(".rank")?;
    let digits = match requested.extension() {
        Some(ext) => rest.strip_suffix(ext.to_str()?)?.strip_suffix('.')?,
        None => rest,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `trace.rank*.ndjson`, for messages.
fn rank_pattern(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    match path.extension() {
        Some(ext) => format!("{stem}.rank*.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank*"),
    }
}

/// Sorts a directory's files by name, with `rank10` after `rank9`.
fn rank_order(path: &Path) -> (String, usize) {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let Some(at) = name.rfind(".rank") else {
        return (name, 0);
    };
    let digits: String = name[at + 5..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (name[..at].to_owned(), digits.parse().unwrap_or(0))
}

fn open_header(path: &Path) -> Result<TraceHeader, InputError> {
    TraceReader::open(path)
        .map(|reader| reader.header().clone())
        .map_err(|e| e.to_string())
}

/// Checks that `files` are one file, or the ranks of one run (one `run`, one world size, each
/// rank once), and puts them in rank order; returns the ranks without a file.
fn check_one_run(label: &str, files: &mut [TraceFile]) -> Result<Vec<usize>, InputError> {
    if let [one] = files {
        return Ok(missing(one.header.world_size, files));
    }
    let mut runs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for file in files.iter() {
        runs.entry(file.header.run.as_str())
            .or_default()
            .push(file.path.display().to_string());
    }
    if runs.len() > 1 {
        let listed: Vec<String> = runs
            .iter()
            .map(|(run, paths)| {
                let run = if run.is_empty() { "(none)" } else { run };
                format!("run {run}: {}", paths.join(", "))
            })
            .collect();
        return Err(format!(
            "{label}: the files belong to {} runs ({}); give the files of one run",
            runs.len(),
            listed.join("; ")
        ));
    }
    if let Some(unranked) = files.iter().find(|f| f.header.rank.is_none()) {
        return Err(format!(
            "{label}: {} has no rank: several files are read together only as the ranks of one \
             run (SessionBuilder::rank or rank_from_env); give one file, or `chrome` for a \
             timeline of several sessions",
            unranked.path.display()
        ));
    }
    files.sort_by_key(|f| f.header.rank);
    for pair in files.windows(2) {
        if pair[0].header.rank == pair[1].header.rank {
            return Err(format!(
                "{label}: {} and {} are both rank {}",
                pair[0].path.display(),
                pair[1].path.display(),
                pair[0].header.rank.unwrap_or(0)
            ));
        }
    }
    let world = files[0].header.world_size;
    if let Some(other) = files.iter().find(|f| f.header.world_size != world) {
        return Err(format!(
            "{label}: {} says {} ranks, {} says {}",
            files[0].path.display(),
            world.unwrap_or(0),
            other.path.display(),
            other.header.world_size.unwrap_or(0)
        ));
    }
    Ok(missing(world, files))
}

/// The ranks below `world` with no file.
fn missing(world: Option<usize>, files: &[TraceFile]) -> Vec<usize> {
    (0..world.unwrap_or(0))
        .filter(|&r| !files.iter().any(|f| f.header.rank == Some(r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{rank_of, rank_order};
    use std::path::Path;

    #[test]
    fn rank_files_are_recognised_by_their_stem() {
        let requested = Path::new("out/trace.ndjson");
        assert_eq!(rank_of(requested, "trace.rank0.ndjson"), Some(0));
        assert_eq!(rank_of(requested, "trace.rank12.ndjson"), Some(12));
        assert_eq!(rank_of(requested, "trace.rank.ndjson"), None);
        assert_eq!(rank_of(requested, "trace.rank1x.ndjson"), None);
        assert_eq!(rank_of(requested, "trace.rank1.json"), None);
        assert_eq!(rank_of(requested, "other.rank1.ndjson"), None);
        assert_eq!(rank_of(Path::new("trace"), "trace.rank3"), Some(3));
    }

    #[test]
    fn rank_ten_comes_after_rank_nine() {
        let mut names = ["t.rank10.ndjson", "t.rank9.ndjson", "t.rank0.ndjson"];
        names.sort_by_key(|n| rank_order(Path::new(n)));
        assert_eq!(
            names,
            ["t.rank0.ndjson", "t.rank9.ndjson", "t.rank10.ndjson"]
        );
    }
}
