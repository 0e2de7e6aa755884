//! The glob of filter patterns: `*` and `?`, nothing else (`[` is a character like any other).

/// Glob match with `*` and `?`, iterative with one backtrack point: linear in practice.
pub(crate) fn glob_match(glob: &str, text: &str) -> bool {
    let glob: Vec<char> = glob.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut g, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some('*') => {
                backtrack = Some((g, t));
                g += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    g = star + 1;
                    t = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("*attn*", "self_attn_probs"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*a*b", "xaxxab"));
        assert!(!glob_match("forward", "forward2"));
    }
}
