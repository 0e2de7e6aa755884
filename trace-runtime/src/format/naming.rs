//! Which file a session writes when it asks for a path: sessions of one process never get the
//! same file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The file for a session that asks for `requested`: `requested` itself for the first session
/// of the process that asks for it, `stem.n.ext` for the `n`-th after it (`stem.n` when the
/// name has no extension).
pub(crate) fn claim_path(requested: &Path) -> PathBuf {
    static CLAIMS: Mutex<Option<HashMap<PathBuf, usize>>> = Mutex::new(None);
    let key = std::path::absolute(requested).unwrap_or_else(|_| requested.to_path_buf());
    let n = {
        let mut claims = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
        let count = claims
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_insert(0);
        let n = *count;
        *count += 1;
        n
    };
    if n == 0 {
        return requested.to_path_buf();
    }
    numbered(requested, n)
}

/// `dir/stem.n.ext`.
fn numbered(path: &Path, n: usize) -> PathBuf {
    with_infix(path, &n.to_string())
}

/// The file of rank `rank` for a session that asks for `requested`: `stem.rank{rank}.ext`
/// (`stem.rank{rank}` when the name has no extension), so the ranks of one run never share a
/// file, wherever they run.
pub(crate) fn ranked(requested: &Path, rank: usize) -> PathBuf {
    with_infix(requested, &format!("rank{rank}"))
}

/// `dir/stem.infix.ext`.
fn with_infix(path: &Path, infix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{infix}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{infix}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_claims_get_numbered_names() {
        let dir = std::env::temp_dir().join(format!("naming-{}", std::process::id()));
        let path = dir.join("run.ndjson");
        assert_eq!(claim_path(&path), path);
        assert_eq!(claim_path(&path), dir.join("run.1.ndjson"));
        assert_eq!(claim_path(&path), dir.join("run.2.ndjson"));
        assert_eq!(claim_path(&dir.join("other")), dir.join("other"));
        assert_eq!(claim_path(&dir.join("other")), dir.join("other.1"));
    }

    #[test]
    fn ranks_get_their_own_names() {
        assert_eq!(
            ranked(Path::new("out/run.ndjson"), 3),
            Path::new("out/run.rank3.ndjson")
        );
        assert_eq!(ranked(Path::new("run"), 0), Path::new("run.rank0"));
    }
}
