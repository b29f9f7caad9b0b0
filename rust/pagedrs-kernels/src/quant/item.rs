//! The item kernel's signature, which every variant implements: the outputs
//! of a range of weight rows for a range of activation rows.

use super::act::QuantActs;
use super::format::QuantWeight;
use std::ops::Range;

/// `(weight, outputs, acts, rows, write)`: every output of `outputs` for
/// every row of `rows`, handed to `write(row, first output, values)` (the
/// values of outputs `first..first + values.len()`).
pub(crate) type ItemFn =
    fn(&QuantWeight, Range<usize>, &QuantActs, Range<usize>, &mut dyn FnMut(usize, usize, &[f32]));
