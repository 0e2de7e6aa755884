use model_trace::{trace_router, trace_router_value};

#[trace_router(scoring = relu, groups = 8)]
fn unknown_scoring_and_groups_not_a_pair(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_router(groups = (4, 5))]
fn more_groups_chosen_than_there_are(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_router(groups = (0, 1), scoring = "sigmoid")]
fn no_groups_and_scoring_a_string(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

#[trace_router]
fn returns_nothing(_x: &[f32]) {}

fn inline(logits: &[f32]) {
    trace_router_value!(logits, scoring = sigmoid);
    trace_router_value!(logits, logits, logits, groups = (2, 0), typo = 1);
}

fn main() {
    unknown_scoring_and_groups_not_a_pair(&[]);
    more_groups_chosen_than_there_are(&[]);
    no_groups_and_scoring_a_string(&[]);
    returns_nothing(&[]);
    inline(&[]);
}
