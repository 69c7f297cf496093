//! Running a model, above `model`: admission control from the same arithmetic the
//! allocations use, opening a model directory end to end (`engine`), the generation loop
//! and token sampling, log-probabilities (`logprobs`); several sequences at once on one
//! engine (`batch`).

pub mod admission;
pub mod batch;
pub mod engine;
pub mod generate;
pub mod logprobs;
pub mod sampling;
