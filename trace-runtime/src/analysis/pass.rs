//! What a forward pass keeps until it ends, to be judged then: its layers' and logits'
//! statistics for the anomaly rules, and its logit rows for the evolution of the tracked tokens.

use crate::config::ModelTracerConfig;
use crate::record::{Anomaly, LayerActivationTrace, LogitEvolutionTrace};
use crate::stats::top_k_by_selection;
use crate::stats::TensorStats;

/// One pass's material for [`find_anomalies`](super::find_anomalies) and the logit evolution.
/// Reused from pass to pass, so its row buffers are allocated once.
#[derive(Debug, Clone, Default)]
pub(crate) struct PassRecorder {
    position: usize,
    layers: Vec<LayerActivationTrace>,
    /// Statistics of the pass's logits tensors with a broken value, by layer.
    broken_logits: Vec<(usize, TensorStats)>,
    /// With explicit `tracked_tokens`: one trace per batch row, ranked as rows arrive.
    tracked: Vec<LogitEvolutionTrace>,
    /// Without: every row, `(layer, batch, values)`, until the final layer is known.
    pending: Vec<(usize, usize, Vec<f32>)>,
    spare: Vec<Vec<f32>>,
}

impl PassRecorder {
    /// Starts over for the pass at `position`.
    pub(crate) fn begin(&mut self, position: usize) {
        self.position = position;
        self.layers.clear();
        self.broken_logits.clear();
        self.tracked.clear();
        self.recycle_rows();
    }

    /// A layer's statistics, for the anomaly rules.
    pub(crate) fn add_layer(&mut self, layer: LayerActivationTrace) {
        self.layers.push(layer);
    }

    /// The statistics of a whole logits tensor read at `layer`, for the anomaly rules.
    pub(crate) fn add_logits_stats(&mut self, layer: usize, stats: &TensorStats) {
        if stats.has_anomaly() {
            self.broken_logits.push((layer, *stats));
        }
    }

    /// One next-token row of logits read at `layer`.
    pub(crate) fn add_logit_row(
        &mut self,
        config: &ModelTracerConfig,
        layer: usize,
        batch: usize,
        row: &[f32],
    ) {
        match &config.tracked_tokens {
            Some(tokens) => self.tracked_trace(tokens, batch).record_logits(layer, row),
            None => {
                let mut copy = self.spare.pop().unwrap_or_default();
                copy.clear();
                copy.extend_from_slice(row);
                self.pending.push((layer, batch, copy));
            }
        }
    }

    fn tracked_trace(&mut self, tokens: &[u32], batch: usize) -> &mut LogitEvolutionTrace {
        let at = match self.tracked.iter().position(|t| t.batch == batch) {
            Some(at) => at,
            None => {
                let mut trace = LogitEvolutionTrace::new(self.position, 1.0, 1.0);
                trace.batch = batch;
                for &token in tokens {
                    trace.track_token(token, String::new());
                }
                self.tracked.push(trace);
                self.tracked.len() - 1
            }
        };
        &mut self.tracked[at]
    }

    /// The pass's verdict: its anomalies (reported one first) and the logit evolution of each
    /// batch row that recorded logits.
    pub(crate) fn finish(
        &mut self,
        config: &ModelTracerConfig,
    ) -> (Vec<Anomaly>, Vec<LogitEvolutionTrace>) {
        let anomalies = super::anomaly::find_pass_anomalies(&self.layers, &self.broken_logits);
        self.layers.clear();
        self.broken_logits.clear();
        let mut traces = std::mem::take(&mut self.tracked);
        if !self.pending.is_empty() {
            traces.extend(self.auto_tracked(config.auto_track_top_k));
        }
        self.recycle_rows();
        for trace in &mut traces {
            trace.finalize();
        }
        traces.retain(|trace| trace.layers_recorded() > 0);
        (anomalies, traces)
    }

    /// Per batch row: the best tokens of its final layer (highest index, the later record on
    /// ties), ranked in each of its rows in recording order.
    fn auto_tracked(&self, top_k: usize) -> Vec<LogitEvolutionTrace> {
        let mut batches: Vec<usize> = self.pending.iter().map(|(_, batch, _)| *batch).collect();
        batches.sort_unstable();
        batches.dedup();
        let (mut positions, mut values) = (Vec::new(), Vec::new());
        batches
            .into_iter()
            .map(|batch| {
                let rows = || self.pending.iter().filter(move |(_, b, _)| *b == batch);
                let final_row = rows()
                    .enumerate()
                    .max_by_key(|(order, (layer, _, _))| (*layer, *order))
                    .map(|(_, (_, _, row))| row.as_slice())
                    .unwrap_or_default();
                top_k_by_selection(
                    final_row,
                    top_k,
                    f32::NEG_INFINITY,
                    &mut positions,
                    &mut values,
                );
                let mut trace = LogitEvolutionTrace::new(self.position, 1.0, 1.0);
                trace.batch = batch;
                for token in positions.iter().filter_map(|&p| u32::try_from(p).ok()) {
                    trace.track_token(token, String::new());
                }
                for (layer, _, row) in rows() {
                    trace.record_logits(*layer, row);
                }
                trace
            })
            .collect()
    }

    fn recycle_rows(&mut self) {
        self.spare
            .extend(self.pending.drain(..).map(|(_, _, row)| row));
    }

    /// Row buffers kept for reuse (for tests of the reuse).
    #[cfg(test)]
    pub(crate) fn spare_rows(&self) -> usize {
        self.spare.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits_with_order(vocab: usize, order: &[u32]) -> Vec<f32> {
        let mut row = vec![0.0; vocab];
        for (i, &t) in order.iter().enumerate() {
            row[t as usize] = 100.0 - i as f32;
        }
        row
    }

    #[test]
    fn auto_tracks_each_batch_rows_final_top_k_and_reuses_buffers() {
        let config = ModelTracerConfig {
            auto_track_top_k: 2,
            ..ModelTracerConfig::full()
        };
        let mut pass = PassRecorder::default();
        for round in 0..2 {
            pass.begin(round);
            pass.add_logit_row(&config, 3, 0, &logits_with_order(10, &[1, 2, 3]));
            pass.add_logit_row(&config, 3, 1, &logits_with_order(10, &[9, 8]));
            pass.add_logit_row(&config, 7, 0, &logits_with_order(10, &[3, 1]));
            let (anomalies, traces) = pass.finish(&config);
            assert!(anomalies.is_empty());
            assert_eq!(traces.len(), 2);
            let ids = |t: &LogitEvolutionTrace| {
                t.tracked_tokens
                    .iter()
                    .map(|t| t.token_id)
                    .collect::<Vec<_>>()
            };
            assert_eq!((traces[0].batch, ids(&traces[0])), (0, vec![3, 1]));
            assert_eq!((traces[1].batch, ids(&traces[1])), (1, vec![9, 8]));
            assert_eq!(traces[0].tracked_tokens[0].ranks_by_layer, [2, 0]);
            assert_eq!(traces[0].position, round);
            assert_eq!(traces[0].decisive_layer, Some(7));
            assert_eq!(pass.spare_rows(), 3);
        }
    }

    #[test]
    fn explicit_tokens_are_ranked_as_rows_arrive() {
        let config = ModelTracerConfig {
            tracked_tokens: Some(vec![4]),
            ..ModelTracerConfig::full()
        };
        let mut pass = PassRecorder::default();
        pass.begin(5);
        pass.add_logit_row(&config, 0, 0, &logits_with_order(6, &[1, 4]));
        pass.add_logit_row(&config, 1, 0, &logits_with_order(6, &[4]));
        let (_, traces) = pass.finish(&config);
        assert_eq!(traces[0].tracked_tokens[0].ranks_by_layer, [1, 0]);
        assert_eq!(pass.spare_rows(), 0);
        // nothing recorded: no trace
        pass.begin(6);
        assert!(pass.finish(&config).1.is_empty());
    }
}
