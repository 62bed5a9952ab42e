// Where a run stands, on every rank: epochs done, steps done, and the epoch's loss sum so far (as
// torchtitan's TrainState). A checkpoint records it and a resume restores it, so a resumed run
// continues exactly. Not the model or optimizer state: those live in FsdpModel's shards.
#pragma once

#include <cstdint>

namespace st {

struct TrainState {
  int64_t epoch = 0;          // epochs completed (the epoch in progress is epoch + 1, 1-based)
  int64_t global_step = 0;    // optimizer steps taken, from the run's start
  int64_t step_in_epoch = 0;  // steps of the epoch in progress already done
  // The sum of the epoch's step losses so far (each the global batch's mean, the same on every
  // rank); divided by the epoch's steps at its end, the epoch's loss.
  double epoch_loss_sum = 0;
  // Early stopping (--eval-split): the lowest eval_loss so far and the evaluations since it (no
  // evaluation yet: best_eval_loss < 0).
  double best_eval_loss = -1;
  int64_t evals_since_best = 0;
};

}  // namespace st
