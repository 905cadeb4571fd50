#pragma once
// The model zoo (private: LibTorch types).
#include <torch/torch.h>

#include <string>
#include <vector>

#include "lathe/core/run_spec.h"

namespace lathe::core {

/// Builds spec.model for samples of `sampleShape` and `numClasses` outputs. Throws ConfigError
/// when the model does not fit the data (a cnn needs C×H×W images). `sparseEmbedding`: embedding
/// tables produce sparse gradients (for the parameter-server exchange of touched rows only).
torch::nn::Sequential makeModel(const RunSpec& spec, const std::vector<int64_t>& sampleShape,
                                int64_t numClasses, bool sparseEmbedding = false);

/// The "wide" features of the embed model: each input value is put into one of kBins bins over
/// 0..1 (pixel-like data; other values are clamped), and (feature, bin) is hashed into `rows`
/// embedding rows, summed per sample. A batch touches a few rows of a large table, so its
/// gradient is sparse.
struct HashedEmbeddingImpl : torch::nn::Module {
    static constexpr int64_t kBins = 16;
    static constexpr int64_t kHashMultiplier = 2654435761;  // Knuth's multiplicative hash
    HashedEmbeddingImpl(int64_t features, int64_t rows, int64_t dim, bool sparse);
    torch::Tensor rowIds(const torch::Tensor& x) const;
    torch::Tensor forward(torch::Tensor x);
    int64_t features, rows;
    bool sparse;
    torch::Tensor weight;
};
TORCH_MODULE(HashedEmbedding);

/// Indices (in model->parameters() order) of parameters whose gradients are sparse.
std::vector<size_t> sparseParameterIndices(torch::nn::Sequential& model);
int64_t parameterCount(const torch::nn::Module& m);

struct ForwardOptions {
    /// Recompute hidden blocks' activations in backward instead of keeping them. Blocks end at
    /// each ReLU (with a following max-pool) and are grouped into about sqrt(blocks) segments;
    /// all but the last segment are checkpointed (checkpoint_sequential's choice).
    bool checkpoint = false;
    c10::optional<c10::ScalarType> autocast;  // recompute under the same autocast as forward
    c10::DeviceType device = c10::DeviceType::CPU;
};

/// The forward pass that also returns the block outputs: after each ReLU, or after the max-pool
/// that follows it (what distillation hints and attention transfer compare).
torch::Tensor forwardWithBlocks(torch::nn::Sequential& model, const torch::Tensor& x,
                                std::vector<torch::Tensor>& blocks);

/// Copies the weights of a Lathe model artifact (a TorchScript file the exporter wrote from the
/// same network: parameters l<i>_weight, l<i>_bias) into `model`. Buffers the file lacks (a
/// quantization-aware layer's input range) keep their values. Throws ConfigError naming the
/// layer when a tensor is missing or has another shape.
void loadInitialWeights(torch::nn::Sequential& model, const std::string& artifactPath);

/// Copies every parameter of `from` into the parameter of the same name in `to` (same network,
/// e.g. a quantization-aware one into its plain form). Throws Error on a mismatch.
void copyParameters(torch::nn::Module& from, torch::nn::Module& to);

/// The model's forward pass, with activation checkpointing when asked.
torch::Tensor forwardModel(torch::nn::Sequential& model, const torch::Tensor& x,
                           const ForwardOptions& options);

}  // namespace lathe::core
