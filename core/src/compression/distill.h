#pragma once
// Knowledge distillation as a training hook (private: LibTorch types). A run whose spec names a
// `teacher` trains its network (the student) on
//
//   (1 - alpha) * CE(student, labels) + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))
//   + hint_weight * sum |regressor(student block) - teacher block|² / |teacher block|²   (FitNets)
//   + attention_transfer / 2 * sum mean over samples of |Q(student map) - Q(teacher map)|²
//                                                                (attention transfer, Zagoruyko & Komodakis)
//
// where Q(A) is the L2-normalised spatial map of the channel mean of A². Both extra terms are
// made independent of the layers' scale and size: the hint relative to the teacher's features'
// energy, the attention distance summed over positions (Zagoruyko's beta = 1000 with the mean
// over a 32×32 map is about beta = 1 here). The teacher is any
// TorchScript classifier (a registered version's file, quantized ones included); its outputs are
// computed once per batch without gradients. Hints and attention transfer need its block outputs:
// the values after each ReLU (or the max-pool that follows one) of its inlined graph, returned
// by a copy of its forward graph; the student's come from forwardWithBlocks (zoo.h). Blocks are
// paired from the end (the last hidden block of each first). Regressors (Linear for flat
// features, 1×1 Conv2d for maps) are the hook's parameters: optimized, exchanged and
// checkpointed with the student's.
#include <memory>

#include "training/training_loop.h"

namespace lathe::core::compression {

std::shared_ptr<TrainingHook> makeDistillHook(const RunSpec& spec);

}  // namespace lathe::core::compression
