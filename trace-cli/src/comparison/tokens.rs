//! The token each run chose at each pass, and the first pass where two runs part: both sides'
//! best tokens and logits, the reference's margin, the other's error on its logits, and whether
//! that error explains the flip (a near-tie) or not (a divergence), with the first layer whose
//! logit lens prefers the other's token.
//!
//! A run's choice at pass N is the best token of its last logits record of that pass (batch row
//! 0), or, where it recorded no logits, the token its pass N + 1 consumed. Where both runs
//! consumed the same token at pass N + 1 though their logits chose differently, they were fed
//! the same tokens (`--tokens-from`, or teacher forcing): the other *would have* chosen its
//! token, and the passes after it still compute the same steps.

use serde::Serialize;
use trace_runtime::compare::TensorComparison;
use trace_runtime::LogitsEvent;

/// How many standard deviations of the difference of two logits' errors a flip may need and
/// still be called a near-tie.
const NEAR_TIE_SIGMAS: f64 = 3.0;

/// Best tokens shown of a row, in the text.
const SHOWN_TOP: usize = 3;

/// A logits row: token ids and their logits, best first.
pub(crate) type Row = Vec<(u32, f32)>;

/// What one pass of one run says of the next token: its logits records, in recording order.
/// The highest layer's is the pass's choice; earlier ones are its logit lens.
#[derive(Debug, Clone, Default)]
pub(crate) struct PassLogits {
    pub(crate) records: Vec<LogitsRecord>,
}

/// One logits record: its layer, its batch row 0's best tokens, and the size of the whole
/// tensor (for the RMS error per logit).
#[derive(Debug, Clone)]
pub(crate) struct LogitsRecord {
    pub(crate) layer: usize,
    pub(crate) row: Row,
    pub(crate) l2_norm: f32,
    pub(crate) count: usize,
}

impl LogitsRecord {
    /// The record of `event`'s batch row 0 (else its first row); `None` for an event without
    /// rows.
    pub(crate) fn of(event: &LogitsEvent) -> Option<Self> {
        let rows = &event.batch_rows;
        let row = rows.iter().find(|r| r.batch == 0).or(rows.first())?;
        Some(Self {
            layer: event.layer,
            row: row
                .top_tokens
                .iter()
                .copied()
                .zip(row.top_logits.iter().copied())
                .collect(),
            l2_norm: event.logits.stats.l2_norm,
            count: event.logits.stats.count,
        })
    }
}

impl PassLogits {
    /// The final logits: the record of the highest layer.
    fn last(&self) -> Option<&LogitsRecord> {
        self.records.iter().max_by_key(|r| r.layer)
    }
}

/// One pass of both runs, waiting for the tokens their next passes consume.
#[derive(Debug)]
struct PendingPass {
    pass: usize,
    logits: [PassLogits; 2],
    /// The comparison of the two runs' final logits in this pass, if they were compared.
    compared: Option<TensorComparison>,
}

/// The first pass where the two runs' choices part, sought pass by pass.
#[derive(Debug, Default)]
pub(crate) struct Choices {
    waiting: Option<PendingPass>,
    /// Passes where both runs' choices are known.
    pub(crate) compared: usize,
    pub(crate) first: Option<FirstTokenDivergence>,
}

impl Choices {
    /// Takes one pass of both runs (`logits` of each, the tokens each consumed, the comparison
    /// of their final logits): the tokens settle the previous pass's choices.
    pub(crate) fn pass(
        &mut self,
        pass: usize,
        logits: [PassLogits; 2],
        consumed: [Option<&[u32]>; 2],
        compared: Option<TensorComparison>,
    ) {
        if self.first.is_some() {
            return;
        }
        if let Some(waiting) = self.waiting.take() {
            // A decode pass consumes the token chosen before it; a longer one (a new prompt) says
            // nothing of it.
            let next = consumed.map(|ids| match ids {
                Some([id]) if pass == waiting.pass + 1 => Some(*id),
                _ => None,
            });
            self.settle(waiting, next);
        }
        if self.first.is_none() {
            self.waiting = Some(PendingPass {
                pass,
                logits,
                compared,
            });
        }
    }

    /// Settles the last pass (no pass after it says what it consumed).
    pub(crate) fn finish(&mut self) {
        if let Some(waiting) = self.waiting.take() {
            self.settle(waiting, [None, None]);
        }
    }

    fn settle(&mut self, waiting: PendingPass, next: [Option<u32>; 2]) {
        let rows = [waiting.logits[0].last(), waiting.logits[1].last()];
        let chosen =
            [0, 1].map(|at| (rows[at].and_then(|r| r.row.first()).map(|t| t.0)).or(next[at]));
        let [Some(reference), Some(other)] = chosen else {
            return;
        };
        self.compared += 1;
        if reference != other {
            self.first = Some(FirstTokenDivergence::new(waiting, [reference, other], next));
        }
    }
}

/// What one run chose at the first pass where the runs part.
#[derive(Debug, Serialize)]
pub(crate) struct Side {
    /// The token it chose.
    pub(crate) token: u32,
    /// The token its next pass consumed; `null` where there is no next pass (or it does not say).
    pub(crate) consumed_next: Option<u32>,
    /// Its best tokens and their logits, best first (empty without logits records).
    pub(crate) top_tokens: Vec<u32>,
    pub(crate) top_logits: Vec<f32>,
}

/// The other run's error on its final logits in that pass.
#[derive(Debug, Serialize)]
pub(crate) struct LogitsError {
    /// `‖other − reference‖ / ‖reference‖` over the whole logits tensor.
    pub(crate) relative_error: f64,
    /// Whether exact (both captured) or estimated from the sketches.
    pub(crate) exact: bool,
    /// The RMS error per logit, `relative_error · ‖reference‖ / √n`.
    pub(crate) rms_error: f64,
    /// The error over its tolerance (with `--floor`, the floor's).
    pub(crate) ratio: f64,
    /// Within its tolerance.
    pub(crate) within_tolerance: bool,
}

/// Whether the other's error explains the flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TokenVerdict {
    /// The other's logits are within tolerance and the two tokens' logits moved against each
    /// other by no more than that error allows: rounding flipped a close choice.
    NearTie,
    /// The other's logits are out of tolerance, or the flip is larger than their error allows
    /// (`divergence`).
    #[serde(rename = "divergence")]
    Diverged,
    /// No logits error to judge by (neither run's logits compared: the choices are known from
    /// the tokens consumed).
    Unknown,
}

/// The first pass where the two runs chose different tokens.
#[derive(Debug, Serialize)]
pub(crate) struct FirstTokenDivergence {
    pub(crate) pass: usize,
    pub(crate) reference: Side,
    pub(crate) other: Side,
    /// The runs went on with the tokens they chose (`true`), or both consumed the same token
    /// next (`false`: they were fed the same tokens; the other would have chosen its token).
    pub(crate) parted: bool,
    /// The reference's logit of its token minus that of its second best.
    pub(crate) reference_margin: Option<f64>,
    /// The reference's logit of its token minus that of the other's token; `null` where the
    /// other's token is not among the reference's best.
    pub(crate) reference_margin_over_other: Option<f64>,
    /// The other's logit of its token minus that of the reference's token; `null` where the
    /// reference's token is not among the other's best.
    pub(crate) other_margin_over_reference: Option<f64>,
    /// How far the two tokens' logits moved against each other: the sum of the two margins
    /// above, the logit difference the other's error had to flip.
    pub(crate) flip: Option<f64>,
    /// The largest flip a near-tie may have: `3·√2` times the other's RMS error per logit.
    pub(crate) near_tie_limit: Option<f64>,
    pub(crate) logits_error: Option<LogitsError>,
    pub(crate) verdict: TokenVerdict,
    /// The first layer from which on every logit lens row of the other (and its final logits)
    /// ranks its token above the reference's; `null` without logit lens records.
    pub(crate) decisive_layer: Option<usize>,
}

impl FirstTokenDivergence {
    fn new(waiting: PendingPass, chosen: [u32; 2], next: [Option<u32>; 2]) -> Self {
        let [reference, other] = chosen;
        let rows = [waiting.logits[0].last(), waiting.logits[1].last()];
        let side = |at: usize| {
            let row = rows[at].map(|r| r.row.as_slice()).unwrap_or_default();
            Side {
                token: chosen[at],
                consumed_next: next[at],
                top_tokens: row.iter().map(|t| t.0).collect(),
                top_logits: row.iter().map(|t| t.1).collect(),
            }
        };
        let logit = |at: usize, token: u32| {
            let row = &rows[at]?.row;
            row.iter().find(|t| t.0 == token).map(|t| f64::from(t.1))
        };
        let reference_margin = rows[0].and_then(|r| match r.row.as_slice() {
            [first, second, ..] => Some(f64::from(first.1) - f64::from(second.1)),
            _ => None,
        });
        let over_other = logit(0, reference).zip(logit(0, other)).map(|(a, b)| a - b);
        let over_reference = logit(1, other).zip(logit(1, reference)).map(|(b, a)| b - a);
        let flip = over_other.zip(over_reference).map(|(a, b)| a + b);
        let logits_error = (waiting.compared.as_ref())
            .zip(rows[0])
            .and_then(|(pair, record)| logits_error(pair, record));
        let near_tie_limit = logits_error
            .as_ref()
            .map(|e| NEAR_TIE_SIGMAS * std::f64::consts::SQRT_2 * e.rms_error);
        let verdict = match (&logits_error, flip.or(over_other), near_tie_limit) {
            (None, ..) => TokenVerdict::Unknown,
            (Some(e), ..) if !e.within_tolerance => TokenVerdict::Diverged,
            (Some(_), Some(flip), Some(limit)) if flip <= limit => TokenVerdict::NearTie,
            (Some(_), ..) => TokenVerdict::Diverged,
        };
        let decisive_layer = decisive_layer(&waiting.logits[1], other, reference);
        Self {
            pass: waiting.pass,
            reference: side(0),
            other: side(1),
            parted: next[0] != next[1] || next.contains(&None),
            reference_margin,
            reference_margin_over_other: over_other,
            other_margin_over_reference: over_reference,
            flip,
            near_tie_limit,
            logits_error,
            verdict,
            decisive_layer,
        }
    }

    /// Where the runs part and what each chose: "pass 5: the reference chose A, the other
    /// would have chosen B (both runs consumed A next)".
    pub(crate) fn headline(&self) -> String {
        let (a, b) = (self.reference.token, self.other.token);
        let how = match (self.reference.consumed_next, self.other.consumed_next) {
            (Some(x), Some(y)) if x == y && y == b => format!(
                "the reference would have chosen {a}, the other chose {b} (both runs consumed \
                 {b} next)"
            ),
            (Some(x), Some(y)) if x == y && x == a => format!(
                "the reference chose {a}, the other would have chosen {b} (both runs consumed \
                 {a} next)"
            ),
            (Some(x), Some(y)) if x == y => format!(
                "the reference would have chosen {a}, the other {b} (both runs consumed {x} next)"
            ),
            (Some(_), Some(_)) => {
                format!("the reference chose {a}, the other {b}, and each went on with its own")
            }
            _ => format!("the reference chose {a}, the other {b}"),
        };
        format!("pass {}: {how}", self.pass)
    }

    /// The text `diff` prints.
    pub(crate) fn text(&self) -> String {
        let top = |side: &Side| {
            let shown: Vec<String> = (side.top_tokens.iter().zip(&side.top_logits))
                .take(SHOWN_TOP)
                .map(|(token, logit)| format!("{token} ({logit:.3})"))
                .collect();
            if shown.is_empty() {
                "no logits recorded".to_owned()
            } else {
                format!("best {}", shown.join(", "))
            }
        };
        let (ours, theirs) = (self.reference.token, self.other.token);
        let mut out = format!(
            "first token divergence: {}\n  reference: {}\n  other:     {}\n",
            self.headline(),
            top(&self.reference),
            top(&self.other)
        );
        let number = |v: Option<f64>| v.map_or_else(|| "unknown".to_owned(), |v| format!("{v:.3}"));
        out += &format!(
            "  the reference's margin of {ours} over {theirs}: {} (over its second best: {}); \
             the other's of {theirs} over {ours}: {}\n",
            number(self.reference_margin_over_other),
            number(self.reference_margin),
            number(self.other_margin_over_reference)
        );
        if let Some(e) = &self.logits_error {
            out += &format!(
                "  the other's logits: {:.3}% relative error{} ({:.3} RMS per logit), {:.2} of \
                 its tolerance\n",
                e.relative_error * 100.0,
                if e.exact { "" } else { ", estimated" },
                e.rms_error,
                e.ratio
            );
        }
        out += &match self.verdict {
            TokenVerdict::NearTie => format!(
                "  verdict: near-tie: the flip ({}) is within what the other's logit error \
                 allows ({}); expected of a port within tolerance\n",
                number(self.flip.or(self.reference_margin_over_other)),
                number(self.near_tie_limit)
            ),
            TokenVerdict::Diverged => match &self.logits_error {
                Some(e) if !e.within_tolerance => {
                    "  verdict: divergence: the other's logits are out of tolerance\n".to_owned()
                }
                _ => format!(
                    "  verdict: divergence: the flip ({}) is larger than the other's logit \
                     error allows ({})\n",
                    number(self.flip.or(self.reference_margin_over_other)),
                    number(self.near_tie_limit)
                ),
            },
            TokenVerdict::Unknown => {
                "  verdict: unknown: the runs' final logits were not compared\n".to_owned()
            }
        };
        if let Some(layer) = self.decisive_layer {
            out += &format!(
                "  the other's logit lens ranks {theirs} above {ours} from layer {layer} on\n"
            );
        }
        out
    }
}

/// The error of a final logits comparison, where it has one (`reference`: the reference's
/// final logits record).
fn logits_error(pair: &TensorComparison, reference: &LogitsRecord) -> Option<LogitsError> {
    let relative_error = pair.error.relative_error?;
    let n = reference.count.max(1) as f64;
    let rms_error = relative_error * f64::from(reference.l2_norm) / n.sqrt();
    let ratio = pair.ratio();
    Some(LogitsError {
        relative_error,
        exact: pair.error.exact,
        rms_error,
        ratio,
        within_tolerance: !pair.verdict.is_divergence(),
    })
}

/// The first layer from which on `logits`' rows (logit lens and final) rank `ours` above
/// `theirs` (a token missing from a row's best ranks below every listed one); `None` without
/// logit lens rows, or where the final row does not.
fn decisive_layer(logits: &PassLogits, ours: u32, theirs: u32) -> Option<usize> {
    let mut records: Vec<&LogitsRecord> = logits.records.iter().collect();
    records.sort_by_key(|r| r.layer);
    if records.len() < 2 {
        return None;
    }
    let rank = |row: &Row, token: u32| row.iter().position(|t| t.0 == token).unwrap_or(usize::MAX);
    let mut from = None;
    for record in records {
        if rank(&record.row, ours) < rank(&record.row, theirs) {
            from.get_or_insert(record.layer);
        } else {
            from = None;
        }
    }
    from
}
