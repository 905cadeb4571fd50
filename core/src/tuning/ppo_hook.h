#pragma once
// The PPO tuning agent inside a run (torch side): with `ppo_policy` set, after every
// `ppo_interval` epochs the agent observes the run (tuning/ppo_types.h: loss trend, gradient
// norm, throughput, validation accuracy and its gain, the current lr and batch relative to the
// start, progress) and picks an action that multiplies the learning rate and the batch size by
// 0.5, 1 or 2 from the next epoch. Every decision and its reward are recorded as the run's
// metrics (ppo/s0…ppo/s7, ppo/action, ppo/logp, ppo/value, ppo/reward, and the lr and batch in
// use, ppo/lr and ppo/batch), from which `lathectl tune` rebuilds the episode to train the
// policy with (study_runner.cpp).
#include <memory>

#include "lathe/core/run_spec.h"
#include "training/training_loop.h"

namespace lathe::core::tuning {

/// Throws Error naming the file when the policy cannot be read.
std::shared_ptr<TrainingHook> makePpoHook(const RunSpec& spec);

}  // namespace lathe::core::tuning
