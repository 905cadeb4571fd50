#pragma once
// Gradient-exchange strategies (private: LibTorch and c10d types). The Reducer (reducer.h) owns
// the buckets, the autograd hooks and the communication thread; how one bucket's gradients are
// averaged across the ranks is a strategy's, found by its name (the run spec's `strategy`):
//
//   ring          exchange_ring.cpp          all-reduce over every rank (asynchronous, from the
//                                            backward hooks) or, compressed, a reduce-scatter and
//                                            an all-gather of compressed shards
//   hierarchical  exchange_hierarchical.cpp  reduce within the host, all-reduce between the
//                                            hosts' leaders (compressed if asked), broadcast back
//   ps            exchange_ps.cpp            bucket k reduced on server rank k mod ps_ranks and
//                                            sent back; sparse embedding rows travel alone
//
// How to add one: a class deriving ExchangeStrategy in its own exchange_<name>.cpp, a factory
// function declared below and one row in exchangeStrategies() (exchange.cpp); the name in the run
// spec's `strategy` choices (run_spec.cpp: a test checks the two lists agree); a case in
// tests/integration/test_reducer.cpp against the plain average.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "distributed/process_group.h"
#include "distributed/reducer.h"
#include "lathe/kernels/compress.h"

namespace lathe::core {

/// Parameters whose gradients travel together (reverse registration order), and the buffers a
/// compressed exchange keeps across steps.
struct Bucket {
    std::vector<size_t> params;    // indices into the reducer's parameters
    std::vector<int64_t> offsets;  // element offset of each in `buffer`
    torch::Tensor buffer;          // the gradients, averaged in place by the exchange
    size_t pending = 0;
    std::vector<char> ready;  // per slot: its gradient arrived this step
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;  // an asynchronous exchange in flight
    // Compression state, kept across steps: the padded working copy and the error-feedback
    // residuals of this rank's contribution and of the shard it reduces.
    torch::Tensor padded, residual, shardResidual;
    int64_t shard = 0;  // elements per rank's shard (a multiple of the chunk)
};

/// Gradients on the wire: fp16/bf16/int8/int4 messages with our kernels (kernels/compress.h, or
/// their CUDA versions where the collectives take GPU tensors), with or without error feedback.
class Codec {
public:
    Codec(const CompressOptions& options, torch::Device commDevice);
    lathe::kernels::CompressFormat format() const { return m_format; }
    bool compressed() const { return m_format != lathe::kernels::CompressFormat::None; }
    bool errorFeedback() const { return m_options.errorFeedback; }
    /// Bytes of one message of n values (codes and per-chunk scales).
    int64_t messageBytes(int64_t n) const;
    /// x (n floats) -> message; with a residual, error feedback (the residual takes the error).
    void encode(const float* x, float* residual, int64_t n, uint8_t* msg, uint64_t seed,
                uint64_t offset) const;
    /// message -> out; `add` accumulates in FP32.
    void decode(const uint8_t* msg, int64_t n, float* out, bool add) const;
    /// The stochastic-rounding seed of one rank's message for a bucket at a step.
    uint64_t seed(int64_t step, size_t bucket, int rank) const;

    // Where exchange buffers live: the CPU for Gloo, the GPU for NCCL.
    torch::TensorOptions floats() const {
        return torch::TensorOptions().dtype(torch::kFloat).device(m_device);
    }
    torch::TensorOptions bytes() const {
        return torch::TensorOptions().dtype(torch::kUInt8).device(m_device);
    }
    torch::TensorOptions longs() const { return torch::TensorOptions().dtype(torch::kLong).device(m_device); }
    bool onGpu() const { return m_device.is_cuda(); }

private:
    CompressOptions m_options;
    lathe::kernels::CompressFormat m_format = lathe::kernels::CompressFormat::None;
    torch::Device m_device;
};

/// What every strategy works with.
struct ExchangeEnv {
    DistContext* ctx = nullptr;
    const Codec* codec = nullptr;
    CompressOptions options;
    /// Called when a bucket's compression buffers are first allocated: residuals restored from
    /// a checkpoint go in then (Reducer::restoreResiduals).
    std::function<void(size_t bucketIndex, Bucket&)> residualsAllocated;
};

class ExchangeStrategy {
public:
    explicit ExchangeStrategy(ExchangeEnv env) : m_env(std::move(env)) {}
    virtual ~ExchangeStrategy() = default;
    virtual const char* name() const = 0;
    /// A one-line description for the log ("ps (2 server ranks)").
    virtual std::string describe() const { return name(); }

    /// True: each bucket goes out from the backward hooks as one asynchronous collective
    /// (launch(), finished by waiting on Bucket::work). False: exchange() runs the buckets one by
    /// one, in order, on the reducer's communication thread.
    virtual bool asynchronous() const { return false; }
    virtual c10::intrusive_ptr<c10d::Work> launch(Bucket& b);
    /// Blocking: averages b.buffer across the ranks in place; returns the bytes this rank sent.
    virtual int64_t exchange(Bucket& b, size_t bucketIndex, int64_t step) = 0;

    /// Whether parameters with sparse gradients (embedding tables) can be exchanged row by row.
    virtual bool takesSparse() const { return false; }
    /// Averages p's (sparse) gradient across ranks into a dense p.grad; `index` counts
    /// exchanges in the step (after the buckets), the same on every rank. Returns bytes sent.
    virtual int64_t exchangeSparse(torch::Tensor& p, size_t index);

protected:
    /// Reduce-scatter and all-gather of compressed shards over every rank, or (`betweenHosts`)
    /// over the hosts' leaders (DistContext::initHierarchy): each rank sends shard j of its (error-fed)
    /// compressed gradient to rank j, which decodes and sums them in FP32, compresses the result again and
    /// all-gathers it; quantized values are never summed in low precision. `average`: divide the sum by the
    /// group size.
    int64_t compressedAllReduce(Bucket& b, size_t bucketIndex, int64_t step, bool betweenHosts, bool average);

    DistContext& ctx() const { return *m_env.ctx; }
    const Codec& codec() const { return *m_env.codec; }
    ExchangeEnv m_env;
};

std::unique_ptr<ExchangeStrategy> makeRingExchange(ExchangeEnv env);
std::unique_ptr<ExchangeStrategy> makeHierarchicalExchange(ExchangeEnv env);
std::unique_ptr<ExchangeStrategy> makeParameterServerExchange(ExchangeEnv env);

struct ExchangeStrategyInfo {
    const char* name;
    const char* summary;
    std::unique_ptr<ExchangeStrategy> (*make)(ExchangeEnv);
};
/// Every strategy, by name.
const std::vector<ExchangeStrategyInfo>& exchangeStrategies();
/// The strategy `name` (env.options.strategy); ConfigError naming the ones there are otherwise.
std::unique_ptr<ExchangeStrategy> makeExchangeStrategy(const std::string& name, ExchangeEnv env);

}  // namespace lathe::core
