#pragma once
// Tensor parallelism (private: LibTorch types), as Megatron-LM splits an MLP block: consecutive
// Linear layers pair up; the first is split by output features over the T ranks of a
// tensor-parallel group (column-parallel: each rank computes its slice of the hidden activation,
// and the elementwise activation after it needs nothing from the others), the second by input
// features (row-parallel: each rank multiplies its slice, the partial products are summed by one
// all-reduce). Backward mirrors it: one all-reduce of the gradient entering the column-parallel
// layer. A hashed embedding table is split by rows (each rank looks up the rows it holds; the
// partial sums are all-reduced). Everything else is replicated on every rank of the group.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lathe::core {

class DistContext;

/// How one layer of the network is split.
enum class TpSplit : int64_t { None = 0, Column = 1, Row = 2, EmbeddingRows = 3 };
const char* toString(TpSplit split);

/// The split of every layer of `model` whose index is in [begin, end) (a pipeline stage, or the
/// whole network; entries outside stay None): Linear layers pair up in order within the range,
/// an odd last one stays whole; hashed embedding tables split by rows. Throws ConfigError when a
/// split dimension is not a multiple of `ranks` (naming the layer) or nothing can be split.
std::vector<TpSplit> planTensorParallel(torch::nn::Sequential& model, int64_t begin, int64_t end, int ranks);

/// Layers [begin, end) of `model` as a Sequential under their own names, the planned ones
/// replaced by this rank's shards (copied from the whole layers, so the shards start from the
/// weights one process would have); `group` is the tensor-parallel group (rank = shard).
torch::nn::Sequential tensorParallelModel(torch::nn::Sequential& model, int64_t begin, int64_t end,
                                          const std::vector<TpSplit>& plan, DistContext& group);

/// Whether a parameter of a shard layer (its gradient norm is summed over the group; replicated
/// parameters are counted once).
bool isShardedParameter(const torch::nn::Sequential& stage, const torch::Tensor& p);

/// One rank's saved layers: layer name ("3") -> parameter name ("weight", "bias") -> tensor.
using ShardState = std::map<std::string, std::map<std::string, torch::Tensor>>;

/// Fills layers [begin, end) of the whole network from the shards each rank of the group saved
/// (`shards[t]`: rank t's): split layers are concatenated, whole ones taken from rank 0's.
void mergeTensorParallel(torch::nn::Sequential& model, const std::vector<TpSplit>& plan, int64_t begin,
                         int64_t end, const std::vector<ShardState>& shards);

}  // namespace lathe::core
