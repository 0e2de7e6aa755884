//! The error split as `diff` prints it: per layer of the table's pass, the stage with the
//! largest total and its three parts, the stage with the largest logic part and that part,
//! then the identity's residual over the run.

use std::fmt::Write as _;

use super::{Dominant, SplitReport};
use crate::style::Colors;

impl SplitReport<'_> {
    /// The split's section of `diff`'s text.
    pub(crate) fn text(&self, out: &mut String, colors: &Colors) {
        for warning in self.warnings {
            let _ = writeln!(out, "{}", colors.warn(&format!("warning: {warning}")));
        }
        let _ = writeln!(
            out,
            "{} pass {}: total (quantized − reference) = quantization (quantized − other) + \
             logic (other − reference), each ‖·‖/‖reference‖",
            colors.bold("error split,"),
            self.table_pass
        );
        if self.table_pass_other_tokens {
            let _ = writeln!(
                out,
                "pass {} not split: the other or the quantized run consumed other token ids \
                 than the reference",
                self.table_pass
            );
        } else if self.layers.is_empty() {
            let _ = writeln!(
                out,
                "no tensor of pass {} is in all three runs",
                self.table_pass
            );
        } else {
            self.table(out, colors);
        }
        self.tally_text(out);
    }

    fn table(&self, out: &mut String, colors: &Colors) {
        let records = self.layers.iter().any(|l| l.quant_records.is_some());
        let line = |cells: [&str; 7], last: &str| {
            format!(
                "{:>5}  {:<16}  {:>10}  {:>12}  {:>10}  {:<26}  {:<12}{last}",
                cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]
            )
        };
        let head = [
            "layer",
            "worst by total",
            "total",
            "quantization",
            "logic",
            "worst logic",
            "dominant",
        ];
        let last = if records { "  quant records" } else { "" };
        let _ = writeln!(out, "{}", colors.bold(line(head, last).trim_end()));
        for row in &self.layers {
            let part = |value: Option<f64>| part_text(value, row.exact);
            let dominant = dominant_text(row.dominant);
            let records = match (records, row.quant_records) {
                (false, _) => String::new(),
                (true, None) => "  -".to_owned(),
                (true, Some(q)) => format!("  {:.2e} ({})", q.worst_relative_error, q.records),
            };
            let layer = row.layer.to_string();
            let parts = [row.total, row.quantization, row.logic].map(part);
            let worst_logic = format!("{} {}", part(row.worst_logic), row.worst_logic_stage);
            let cells = [
                layer.as_str(),
                row.stage,
                &parts[0],
                &parts[1],
                &parts[2],
                &worst_logic,
                dominant,
            ];
            let _ = writeln!(out, "{}", line(cells, &records).trim_end());
        }
        let mut notes = vec![
            "worst logic: the layer's largest logic part and its stage; dominant: the layer's \
             largest quantization part against its largest logic part",
        ];
        if self.layers.iter().any(|l| !l.exact) {
            notes.push("≈: estimated from the sketches, the three runs not all captured");
        }
        if records {
            notes.push(
                "quant records: the worst ‖q − r‖/‖r‖ of the layer's quantized matmuls against \
                 their own f32 matmuls (how many)",
            );
        }
        let _ = writeln!(out, "{}", colors.dim(&format!("({})", notes.join("; "))));
    }

    /// The identity's residual over the run, and what was not split.
    fn tally_text(&self, out: &mut String) {
        let t = self.tally;
        let _ = writeln!(
            out,
            "identity: |quantization + logic − total| at most {:.1e} over the {} tensors split \
             ({} from captures, {} ≈ from sketches)",
            t.identity_residual, t.split, t.exact, t.estimated
        );
        let mut missing = Vec::new();
        if t.not_in_quantized > 0 {
            missing.push(format!(
                "{} compared tensors are not in the quantized run",
                t.not_in_quantized
            ));
        }
        if t.not_split > 0 {
            missing.push(format!(
                "{} could not be split ({} of them shapes that differ; the others neither \
                 captures nor sketches in all three)",
                t.not_split, t.shapes_differ
            ));
        }
        if let Some(first) = t.first_pass_other_tokens {
            missing.push(format!(
                "{} passes not split, the other or the quantized run consuming other token ids \
                 than the reference, the first of them pass {first}",
                t.passes_other_tokens
            ));
        }
        if t.non_finite_elements > 0 {
            missing.push(format!(
                "{} elements left out, NaN or infinite in a run",
                t.non_finite_elements
            ));
        }
        if !missing.is_empty() {
            let _ = writeln!(out, "{}", missing.join("; "));
        }
    }
}

/// A part, `≈` before an estimate, `-` where the reference is all zeros.
fn part_text(value: Option<f64>, exact: bool) -> String {
    value.map_or_else(
        || "-".to_owned(),
        |v| format!("{}{v:.2e}", if exact { "" } else { "≈" }),
    )
}

fn dominant_text(dominant: Dominant) -> &'static str {
    match dominant {
        Dominant::Quantization => "quantization",
        Dominant::Logic => "logic",
        Dominant::Neither => "-",
    }
}
