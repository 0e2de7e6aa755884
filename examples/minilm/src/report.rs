//! "Which token does each token attend to most", per layer and head, from either source of
//! attention: the probabilities `Model::forward_with_attention` captured, or the rows a
//! model-trace session recorded through `#[trace_attention]`. Both give the same lines (the
//! traced tests check it): candle's `argmax` and the tracer's top-k both break ties towards the
//! lower position.

use candle_core::{Tensor, D};
use model_trace::AttentionWeightTrace;

/// `keys[layer][head][query]`: the key position that query attends to most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrongestKeys {
    pub keys: Vec<Vec<Vec<usize>>>,
}

impl StrongestKeys {
    /// From each layer's `[batch, heads, query, key]` probabilities; batch row 0, the row the
    /// tracer reads.
    pub fn from_probabilities(attention: &[Tensor]) -> candle_core::Result<Self> {
        let keys = attention
            .iter()
            .map(|probs| {
                let strongest: Vec<Vec<u32>> = probs.get(0)?.argmax(D::Minus1)?.to_vec2()?;
                Ok(strongest
                    .into_iter()
                    .map(|head| head.into_iter().map(|key| key as usize).collect())
                    .collect())
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(StrongestKeys { keys })
    }

    /// From recorded attention rows (one forward pass: a later record of the same row replaces
    /// an earlier one). `None` unless every one of the `layers x heads x queries` rows was
    /// recorded with at least one kept key; a session whose filter or `AttentionTraceConfig`
    /// left some out, or a row spread so thin that no weight reached the threshold, has no
    /// complete answer.
    pub fn from_traces(
        traces: &[AttentionWeightTrace],
        layers: usize,
        heads: usize,
        queries: usize,
    ) -> Option<Self> {
        let mut grid = vec![vec![vec![None; queries]; heads]; layers];
        for trace in traces {
            let row = grid
                .get_mut(trace.layer_idx)
                .and_then(|layer| layer.get_mut(trace.head_idx))
                .and_then(|head| head.get_mut(trace.query_pos));
            if let Some(row) = row {
                *row = trace.top_k_positions.first().copied();
            }
        }
        let keys = grid
            .into_iter()
            .map(|layer| {
                layer
                    .into_iter()
                    .map(|head| head.into_iter().collect::<Option<Vec<usize>>>())
                    .collect::<Option<Vec<_>>>()
            })
            .collect::<Option<Vec<_>>>()?;
        Some(StrongestKeys { keys })
    }

    /// One line per layer and head: `L0 H3: [CLS]->[SEP] this->is ...`.
    pub fn lines(&self, labels: &[String]) -> Vec<String> {
        let mut lines = Vec::new();
        for (layer, heads) in self.keys.iter().enumerate() {
            for (head, keys) in heads.iter().enumerate() {
                let arrows: Vec<String> = keys
                    .iter()
                    .zip(labels)
                    .map(|(&key, query)| {
                        let key = labels.get(key).map_or("?", String::as_str);
                        format!("{query}->{key}")
                    })
                    .collect();
                lines.push(format!("L{layer} H{head}: {}", arrows.join(" ")));
            }
        }
        lines
    }
}

/// Tokens as they appear in the attention lines; a repeated token gets its position (`the@4`) so
/// that every arrow points at one place.
pub fn token_labels(tokens: &[String]) -> Vec<String> {
    tokens
        .iter()
        .enumerate()
        .map(|(position, token)| {
            if tokens.iter().filter(|other| *other == token).count() > 1 {
                format!("{token}@{position}")
            } else {
                token.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Vec<String> {
        token_labels(&["a".into(), "b".into(), "a".into()])
    }

    #[test]
    fn repeated_tokens_are_labelled_with_their_position() {
        assert_eq!(labels(), ["a@0", "b", "a@2"]);
    }

    #[test]
    fn probabilities_and_traces_give_the_same_lines() {
        // One layer, one head, three queries; query 1 has a tie between keys 0 and 2.
        let rows = [[0.7f32, 0.2, 0.1], [0.4, 0.2, 0.4], [0.1, 0.1, 0.8]];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let probs = Tensor::from_vec(flat, (1, 1, 3, 3), &candle_core::Device::Cpu).unwrap();
        let captured = StrongestKeys::from_probabilities(&[probs]).unwrap();
        let traces: Vec<AttentionWeightTrace> = rows
            .iter()
            .enumerate()
            .map(|(query, row)| AttentionWeightTrace::from_weights(0, 0, query, row, 2))
            .collect();
        let traced = StrongestKeys::from_traces(&traces, 1, 1, 3).unwrap();
        assert_eq!(captured, traced);
        assert_eq!(
            captured.lines(&labels()),
            ["L0 H0: a@0->a@0 b->a@0 a@2->a@2"]
        );
    }

    #[test]
    fn a_missing_row_gives_no_traced_answer() {
        let trace = AttentionWeightTrace::from_weights(0, 0, 0, &[1.0], 1);
        assert!(StrongestKeys::from_traces(std::slice::from_ref(&trace), 1, 1, 2).is_none());
        assert!(StrongestKeys::from_traces(&[trace], 1, 1, 1).is_some());
    }
}
