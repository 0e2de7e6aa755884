//! What the comparison finds, folded pass by pass: each pass of the traces compared as it comes
//! (the floor's with the reference's first, for the tolerances it sets), and kept only as far
//! as the report needs.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use trace_runtime::compare::{
    compare, compare_with_least_rtol, full_name, CompareOptions, Comparison, TensorComparison,
    TensorKey, TraceTensors, TracedTensor, Unmatched, UnusedOverride, Verdict,
};
use trace_runtime::{CaptureError, CaptureFiles};

use super::floor::{NoFloor, TensorFloor, TensorJudgement, TensorWithoutFloor};
use super::routing::{LayerStages, RoutingComparison};
use super::split::{PassSplit, Splitter};
use super::stream::{PassTensors, ReaderTally};
use super::tokens::{Choices, PassLogits};
use super::LISTED;
use crate::input::TraceRun;

/// Passes of a trace whose token ids differ from the reference's, each a warning of its own;
/// the others are counted in one.
const TOKEN_WARNINGS: usize = 3;

/// Token ids shown of a pass's, in a warning.
const SHOWN_TOKENS: usize = 8;

/// What the comparison found so far, folded pass by pass.
#[derive(Debug, Default)]
pub(super) struct Findings {
    pub(super) counts: VerdictCounts,
    /// The first divergence (of an isolated run, the first among what the layers computed).
    pub(super) first: Option<TensorJudgement>,
    pub(super) passes: Vec<PassRow>,
    pub(super) table: TablePass,
    pub(super) missing: FirstItems<Unmatched>,
    pub(super) extra: FirstItems<Unmatched>,
    /// Captures that could not be read, tensors read out of pass order, passes that consumed
    /// other tokens than the reference's.
    pub(super) warnings: FirstItems<String>,
    /// Full names (after renaming) of every tensor of either trace: which overrides matched
    /// (kept only when there are overrides).
    names: HashSet<String>,
    track_names: bool,
    pub(super) unused_overrides: Vec<UnusedOverride>,
    /// The other trace is an isolated run: layer inputs are not candidates for the first
    /// divergence.
    pub(super) inputs_fed: bool,
    /// With a floor: how many times its error the other may have.
    pub(super) floor_factor: Option<f64>,
    /// Tensors of the reference the floor matched.
    pub(super) floor_matched: usize,
    /// Compared tensors the floor set no tolerance for.
    pub(super) no_floor: FirstItems<TensorWithoutFloor>,
    /// Compared tensors whose error and the floor's were measured unlike: one by captures, the
    /// other bounded by summaries.
    pub(super) unlike_floor: FirstItems<TensorKey>,
    /// Passes that consumed other token ids than the reference's: per run after the
    /// reference (the other's, the floor's, the quantized run's).
    other_tokens: Vec<TokenMismatches>,
    /// The capture files read so far, each one's header parsed once.
    captures: CaptureFiles,
    /// The tokens each run chose, pass by pass, until they part.
    pub(super) choices: Choices,
    /// With a quantized run (`--quantized`): the error split, folded pass by pass.
    pub(super) split: Option<Splitter>,
    /// Whether the first divergence is the first tensor compared.
    pub(super) first_is_first_compared: bool,
    /// The routers of the traces compared, pass by pass.
    pub(super) routing: RoutingComparison,
    /// What each layer's `mlp_in` and `mlp_out` did over the passes (for the routing's
    /// verdicts).
    layer_stages: BTreeMap<usize, LayerStages>,
}

/// How many compared tensors had each verdict.
#[derive(Debug, Default, Serialize)]
pub(super) struct VerdictCounts {
    pub(super) matched: usize,
    pub(super) bit_identical: usize,
    pub(super) close: usize,
    pub(super) diverged: usize,
    pub(super) shape_mismatch: usize,
}

/// One pass: its worst ratio, and how many of its tensors diverged.
#[derive(Debug, Serialize)]
pub(crate) struct PassRow {
    pub(crate) pass: usize,
    pub(crate) worst_ratio: f64,
    pub(crate) diverged: usize,
}

/// The pass of the per-layer table, its compared tensors and their split.
#[derive(Debug, Default)]
pub(super) struct TablePass {
    /// The pass asked for.
    requested: Option<usize>,
    pub(super) pass: Option<usize>,
    pub(super) pairs: Vec<TensorJudgement>,
    /// The split of its tensors, with a quantized run.
    pub(super) split: PassSplit,
    /// Its worst ratio, while it is the pass with the largest error.
    worst_ratio: f64,
}

/// The first [`LISTED`] items, and how many there were.
#[derive(Debug)]
pub(super) struct FirstItems<T> {
    pub(super) items: Vec<T>,
    pub(super) count: usize,
}

/// The passes of a trace that consumed other token ids than the same passes of the reference:
/// the first [`TOKEN_WARNINGS`] are each a warning, the others counted.
#[derive(Debug, Default)]
struct TokenMismatches {
    passes: usize,
    /// The first pass counted, not warned of.
    first_counted: Option<usize>,
}

/// Where the first divergence is, as one pass is folded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstDivergence {
    /// In an earlier pass.
    Earlier,
    /// In this pass.
    Here,
    /// Nowhere yet.
    NotYet,
}

impl Findings {
    pub(super) fn new(
        pass: Option<usize>,
        options: &CompareOptions,
        floor_factor: Option<f64>,
    ) -> Self {
        let t = &options.tolerances;
        Self {
            floor_factor,
            table: TablePass {
                requested: pass,
                ..TablePass::default()
            },
            track_names: !(t.atol_overrides.is_empty()
                && t.rtol_overrides.is_empty()
                && t.error_stat_overrides.is_empty()),
            routing: RoutingComparison::new(t.clone()),
            ..Self::default()
        }
    }

    /// Notes a tensor's full name, for the overrides that matched none.
    fn saw(&mut self, layer: usize, name: &str) {
        if self.track_names {
            let full = full_name(layer, name);
            if !self.names.contains(&full) {
                self.names.insert(full);
            }
        }
    }

    /// Compares `passes`, each item one pass of each trace matched by pass number (the
    /// reference's, the other's, and the floor's if there is one; `labels` naming them); with
    /// a floor, compares it with the reference first, pass by pass, for the tolerances it
    /// sets. A pass that consumed other token ids than the reference's is a warning.
    pub(super) fn compare_passes(
        &mut self,
        passes: impl Iterator<Item = Vec<Option<PassTensors>>>,
        options: &CompareOptions,
        labels: &[&str],
    ) {
        for mut passes in passes {
            self.compare_tokens(&passes, labels);
            self.compare_pass(&mut passes, options);
        }
        self.choices.finish();
    }

    /// Compares one pass of each trace (see [`Self::compare_passes`]) and folds the
    /// comparison in.
    fn compare_pass(&mut self, passes: &mut [Option<PassTensors>], options: &CompareOptions) {
        let empty = TraceTensors::default();
        let pass = passes[..2].iter().flatten().next().and_then(|p| p.pass);
        let tensors = |at: usize| passes.get(at).and_then(Option::as_ref).map(|p| &p.tensors);
        let floors = match (self.floor_factor, tensors(0)) {
            (Some(_), Some(reference)) => {
                Some(self.floor_errors(reference, tensors(2).unwrap_or(&empty), options))
            }
            _ => None,
        };
        let factor = self.floor_factor.unwrap_or(1.0);
        let compared = compare_with_least_rtol(
            tensors(0).unwrap_or(&empty),
            tensors(1).unwrap_or(&empty),
            options,
            |_, tensor| captured(&mut self.captures, tensor),
            |key| match floors.as_ref()?.get(key)? {
                TensorFloor::Error { rtol, .. } => Some(rtol * factor),
                TensorFloor::Without(_) => None,
            },
        );
        if let Some(pass) = pass {
            self.choose_tokens(pass, passes, &compared.pairs);
        }
        self.compare_routers(pass, passes);
        let split = self.split_pass(passes, options);
        self.fold(pass, floors.as_ref(), compared, split);
    }

    /// Hands the routing comparison the router calls of one pass (see
    /// [`Self::compare_passes`]): the reference's, the other's, and the floor's where there is
    /// one.
    fn compare_routers(&mut self, pass: Option<usize>, passes: &[Option<PassTensors>]) {
        let routers = |at: usize| passes.get(at)?.as_ref().map(|p| p.routers.as_slice());
        let floor = if self.floor_factor.is_some() {
            routers(2)
        } else {
            None
        };
        let position = passes[0].as_ref().and_then(|p| p.position);
        self.routing
            .pass(pass, position, [routers(0), routers(1), floor]);
    }

    /// The error split of one pass (see [`Self::compare_passes`]), with a quantized run.
    fn split_pass(
        &mut self,
        passes: &[Option<PassTensors>],
        options: &CompareOptions,
    ) -> PassSplit {
        let Some(splitter) = self.split.as_mut() else {
            return PassSplit::default();
        };
        let tensors = |at: usize| passes.get(at).and_then(Option::as_ref);
        let (Some(reference), Some(other)) = (tensors(0), tensors(1)) else {
            return PassSplit::default();
        };
        // A pass the port or the quantized run consumed other token ids in than the reference
        // (where they say) is not split: its differences would be the inputs'.
        let ours = reference.tokens.as_deref();
        let other_tokens = [tensors(1), tensors(splitter.at)].into_iter().any(|run| {
            let theirs = run.and_then(|p| p.tokens.as_deref());
            matches!((ours, theirs), (Some(ours), Some(theirs)) if ours != theirs)
        });
        if let (true, Some(pass)) = (other_tokens, reference.pass) {
            return splitter.other_tokens(pass);
        }
        let quantized = tensors(splitter.at).map(|q| (&q.tensors, q.quant.as_slice()));
        let captures = &mut self.captures;
        let mut warnings = Vec::new();
        let split = splitter.pass(
            [&reference.tensors, &other.tensors],
            quantized,
            options,
            &mut |tensor| captured(captures, tensor),
            &mut warnings,
        );
        for warning in warnings {
            self.warnings.push(warning);
        }
        split
    }

    /// Hands on what the two runs chose in `pass` (`passes`: one of each trace): their logits
    /// records, the tokens they consumed, and the comparison of their final logits among
    /// `pairs`.
    fn choose_tokens(
        &mut self,
        pass: usize,
        passes: &mut [Option<PassTensors>],
        pairs: &[TensorComparison],
    ) {
        let logits = [0, 1].map(|at| {
            (passes[at].as_mut())
                .map_or_else(PassLogits::default, |p| std::mem::take(&mut p.logits))
        });
        let final_logits = (pairs.iter())
            .filter(|pair| pair.name == "logits")
            .max_by_key(|pair| pair.layer)
            .cloned();
        let consumed = [0, 1].map(|at| passes[at].as_ref().and_then(|p| p.tokens.as_deref()));
        self.choices.pass(pass, logits, consumed, final_logits);
    }

    /// Warns of each of `passes` (one pass of each trace, `labels` naming the traces) that
    /// consumed other token ids than the reference's; says nothing where either does not say
    /// which ids it consumed.
    fn compare_tokens(&mut self, passes: &[Option<PassTensors>], labels: &[&str]) {
        let Some(reference) = &passes[0] else {
            return;
        };
        let (Some(pass), Some(ours)) = (reference.pass, reference.tokens.as_deref()) else {
            return;
        };
        for (at, theirs) in passes.iter().enumerate().skip(1) {
            if let Some(theirs) = theirs.as_ref().and_then(|p| p.tokens.as_deref()) {
                if ours != theirs {
                    self.other_tokens_in(at - 1, pass, [labels[0], labels[at]], [ours, theirs]);
                }
            }
        }
    }

    /// Warns that `pass` consumed other token ids in the reference than in the other or the
    /// floor (`at`: 0, 1), `labels` and `ids` the reference's then theirs; past
    /// [`TOKEN_WARNINGS`] such passes of that trace, counts it instead.
    fn other_tokens_in(&mut self, at: usize, pass: usize, labels: [&str; 2], ids: [&[u32]; 2]) {
        if self.other_tokens.len() <= at {
            self.other_tokens
                .resize_with(at + 1, TokenMismatches::default);
        }
        let seen = &mut self.other_tokens[at];
        seen.passes += 1;
        if seen.passes > TOKEN_WARNINGS {
            seen.first_counted.get_or_insert(pass);
            return;
        }
        let first = ids[0]
            .iter()
            .zip(ids[1])
            .take_while(|(a, b)| a == b)
            .count();
        let hidden = if first >= SHOWN_TOKENS {
            format!(", differing first at index {first}")
        } else {
            String::new()
        };
        self.warnings.push(format!(
            "pass {pass} consumed other tokens in {} ({}) than in {} ({}){hidden}",
            labels[0],
            ids_text(ids[0]),
            labels[1],
            ids_text(ids[1])
        ));
    }

    /// What the floor says of each tensor of one pass of the reference it matched: its error
    /// (the smallest rtol at which it is close), or why there is none.
    fn floor_errors(
        &mut self,
        reference: &TraceTensors,
        floor: &TraceTensors,
        options: &CompareOptions,
    ) -> HashMap<TensorKey, TensorFloor> {
        let compared = compare(reference, floor, options, |_, tensor| {
            captured(&mut self.captures, tensor)
        });
        for warning in compared.warnings {
            self.warnings.push(format!("the floor: {warning}"));
        }
        self.floor_matched += compared.pairs.len();
        compared
            .pairs
            .into_iter()
            .map(|pair| {
                let of = match (pair.verdict, pair.least_rtol) {
                    (Verdict::ShapeMismatch, _) => TensorFloor::Without(NoFloor::ShapeMismatch),
                    (_, None) => TensorFloor::Without(NoFloor::NotClose),
                    (_, Some(rtol)) => TensorFloor::Error {
                        rtol,
                        exact: pair.error.exact,
                    },
                };
                (key_of(&pair), of)
            })
            .collect()
    }

    /// Folds one pass's comparison in, with what the floor says of its tensors and their
    /// split.
    fn fold(
        &mut self,
        pass: Option<usize>,
        floors: Option<&HashMap<TensorKey, TensorFloor>>,
        compared: Comparison,
        split: PassSplit,
    ) {
        for unmatched in compared.missing {
            self.saw(unmatched.layer, &unmatched.name);
            self.missing.push(unmatched);
        }
        for unmatched in compared.extra {
            self.saw(unmatched.layer, &unmatched.name);
            self.extra.push(unmatched);
        }
        for warning in compared.warnings {
            self.warnings.push(warning);
        }
        if compared.pairs.is_empty() {
            return;
        }
        let pairs: Vec<TensorJudgement> = (compared.pairs.into_iter())
            .map(|pair| self.judge(pair, floors))
            .collect();
        let first_before = self.first.is_some();
        let row = self.tally(pass, &pairs);
        let first = match (first_before, self.first.is_some()) {
            (true, _) => FirstDivergence::Earlier,
            (false, true) => FirstDivergence::Here,
            (false, false) => FirstDivergence::NotYet,
        };
        self.table
            .offer(pass, (pairs, split), row.worst_ratio, first);
        self.passes.push(row);
    }

    /// `pair` judged with the tolerance the floor sets it (`floors`: what the floor says of
    /// the pass's tensors; `None` without a floor); a tensor it sets none for, or one whose
    /// error and the floor's were measured unlike, is noted.
    fn judge(
        &mut self,
        pair: TensorComparison,
        floors: Option<&HashMap<TensorKey, TensorFloor>>,
    ) -> TensorJudgement {
        let floor = floors.map(|floors| {
            let key = key_of(&pair);
            let of = floors.get(&key).copied();
            let of = of.unwrap_or(TensorFloor::Without(NoFloor::Missing));
            match of {
                TensorFloor::Without(why) => {
                    self.no_floor.push(TensorWithoutFloor { tensor: key, why });
                }
                TensorFloor::Error { rtol, exact } if rtol > 0.0 && exact != pair.error.exact => {
                    self.unlike_floor.push(key);
                }
                TensorFloor::Error { .. } => {}
            }
            of
        });
        TensorJudgement::new(pair, floor)
    }

    /// Counts the verdicts of one pass's `pairs`, notes their names and the first divergence;
    /// the pass's row.
    fn tally(&mut self, pass: Option<usize>, pairs: &[TensorJudgement]) -> PassRow {
        let mut row = PassRow {
            pass: pass.unwrap_or(0),
            worst_ratio: 0.0,
            diverged: 0,
        };
        for judged in pairs {
            let pair = &judged.pair;
            self.counts.count(pair.verdict);
            self.saw(pair.layer, &pair.name);
            row.worst_ratio = row.worst_ratio.max(pair.ratio());
            if pair.verdict.is_divergence() {
                row.diverged += 1;
                let fed = self.inputs_fed && pair.name == "input";
                if self.first.is_none() && !fed {
                    self.first = Some(judged.clone());
                    self.first_is_first_compared = self.counts.matched == 1;
                }
            }
        }
        self.note_layer_stages(pairs);
        row
    }

    /// Notes what each layer's `mlp_in` and `mlp_out` did in one pass: their ratios (error
    /// over what the tolerance allows), and where `mlp_out` diverged, how many times its
    /// ratio is `mlp_in`'s (a divergence of the layer's own is far more than its input's).
    fn note_layer_stages(&mut self, pairs: &[TensorJudgement]) {
        let ratios = |name: &str| -> BTreeMap<usize, (f64, bool)> {
            (pairs.iter())
                .filter(|judged| judged.pair.name == name)
                .map(|judged| {
                    let pair = &judged.pair;
                    (pair.layer, (pair.ratio(), pair.verdict.is_divergence()))
                })
                .collect()
        };
        let (mlp_in, mlp_out) = (ratios("mlp_in"), ratios("mlp_out"));
        for (&layer, &(ratio, _)) in &mlp_in {
            let stages = self.layer_stages.entry(layer).or_default();
            stages.mlp_in_ratio = Some(stages.mlp_in_ratio.map_or(ratio, |r| r.max(ratio)));
        }
        for (&layer, &(ratio, diverged)) in &mlp_out {
            let stages = self.layer_stages.entry(layer).or_default();
            stages.mlp_out_diverged |= diverged;
            if let (true, Some(&(input, _))) = (diverged, mlp_in.get(&layer)) {
                let gain = ratio / input;
                stages.mlp_out_gain = Some(stages.mlp_out_gain.map_or(gain, |g| g.max(gain)));
            }
        }
    }

    /// What is known only at the end: overrides that matched nothing, tensors out of order.
    pub(super) fn finish(
        &mut self,
        options: &CompareOptions,
        tallies: &[ReaderTally],
        runs: &[&TraceRun],
    ) {
        self.unused_overrides = options.tolerances.unused_overrides(&self.names);
        for (seen, run) in self.other_tokens.iter().zip(&runs[1..]) {
            if let Some(first) = seen.first_counted {
                self.warnings.push(format!(
                    "{} more passes consumed other tokens in {} than in {}, the first of them \
                     pass {first}",
                    seen.passes - TOKEN_WARNINGS,
                    runs[0].label,
                    run.label
                ));
            }
        }
        for (tally, run) in tallies.iter().zip(runs) {
            if tally.late > 0 {
                self.warnings.push(format!(
                    "{}: {} tensors came after their pass had been compared (the file is not in \
                     pass order) and were not compared",
                    run.label, tally.late
                ));
            }
        }
        if self.table.pass.is_none() {
            self.table.pass = self.table.requested;
        }
        self.routing.finish(&self.layer_stages, self.floor_factor);
    }
}

impl VerdictCounts {
    fn count(&mut self, verdict: Verdict) {
        self.matched += 1;
        *match verdict {
            Verdict::BitIdentical => &mut self.bit_identical,
            Verdict::Close => &mut self.close,
            Verdict::Diverged => &mut self.diverged,
            Verdict::ShapeMismatch => &mut self.shape_mismatch,
        } += 1;
    }
}

impl TablePass {
    /// Takes one pass's `pairs` and their split as the table's if theirs is the pass asked
    /// for; else, none asked for, if the first divergence is in it, or (none anywhere yet) if
    /// it is the first pass or its worst ratio is the largest so far.
    fn offer(
        &mut self,
        pass: Option<usize>,
        (pairs, split): (Vec<TensorJudgement>, PassSplit),
        worst_ratio: f64,
        first: FirstDivergence,
    ) {
        let keep = match (self.requested, first) {
            (Some(requested), _) => pass == Some(requested),
            (None, FirstDivergence::Earlier) => false,
            (None, FirstDivergence::Here) => true,
            (None, FirstDivergence::NotYet) => {
                self.pass.is_none() || worst_ratio > self.worst_ratio
            }
        };
        if keep {
            self.pass = pass;
            self.worst_ratio = worst_ratio;
            self.pairs = pairs;
            self.split = split;
        }
    }
}

impl<T> Default for FirstItems<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            count: 0,
        }
    }
}

impl<T> FirstItems<T> {
    fn push(&mut self, item: T) {
        self.count += 1;
        if self.items.len() < LISTED {
            self.items.push(item);
        }
    }
}

/// The values of a captured tensor, read from beside the trace file it came from.
fn captured(
    files: &mut CaptureFiles,
    tensor: &TracedTensor,
) -> Option<Result<Vec<f32>, CaptureError>> {
    let capture = tensor.tensor.capture.as_ref()?;
    let file = tensor.file.as_ref()?;
    Some(files.read_capture(file, capture).map(|(_, values)| values))
}

/// `[7042, 30]`: the first [`SHOWN_TOKENS`] ids, then `…` and how many there are.
fn ids_text(ids: &[u32]) -> String {
    let shown: Vec<String> = ids.iter().take(SHOWN_TOKENS).map(u32::to_string).collect();
    if ids.len() > SHOWN_TOKENS {
        format!("[{}, …] ({} ids)", shown.join(", "), ids.len())
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// What a compared tensor is matched by.
fn key_of(pair: &TensorComparison) -> TensorKey {
    TensorKey {
        pass: pair.pass,
        layer: pair.layer,
        name: pair.name.clone(),
        shard: pair.shard,
    }
}
