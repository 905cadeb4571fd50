// Tensor parallelism: the column/row split of Linear pairs and the row split of embedding tables,
// with the two all-reduces of each pair as autograd functions (tensor_parallel.h).
#include "distributed/tensor_parallel.h"

#include <algorithm>

#include "distributed/process_group.h"
#include "lathe/core/error.h"
#include "training/zoo.h"

namespace lathe::core {

const char* toString(TpSplit split) {
    switch (split) {
        case TpSplit::None:
            return "whole";
        case TpSplit::Column:
            return "column";
        case TpSplit::Row:
            return "row";
        case TpSplit::EmbeddingRows:
            return "embedding rows";
    }
    return "?";
}

namespace {

DistContext& groupOf(const torch::autograd::AutogradContext* ctx) {
    return *reinterpret_cast<DistContext*>(ctx->saved_data.at("group").toInt());
}

// A sum over the group in FP32 (whatever the activation's dtype under autocast), in place of `t`.
torch::Tensor allreduced(DistContext& group, const torch::Tensor& t) {
    auto f = t.to(torch::kFloat).contiguous().clone();
    group.allreduceSum(f);
    return f.to(t.scalar_type());
}

// Megatron's f: the identity in forward; in backward the gradient of the (replicated) input is
// the sum of every rank's, since each rank's shard of the next layer used all of it.
struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t group) {
        ctx->saved_data["group"] = group;
        return x.clone();
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        return {allreduced(groupOf(ctx), grads[0]), torch::Tensor()};
    }
};

// Megatron's g: the sum of the ranks' partial results in forward; the identity in backward.
struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t group) {
        ctx->saved_data["group"] = group;
        return allreduced(*reinterpret_cast<DistContext*>(group), x);
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                   torch::autograd::variable_list grads) {
        return {grads[0], torch::Tensor()};
    }
};

int64_t groupHandle(DistContext& g) { return reinterpret_cast<int64_t>(&g); }

// Rows [rank * n / size, (rank + 1) * n / size) of dimension `dim`.
torch::Tensor shardOf(const torch::Tensor& t, int64_t dim, int rank, int size) {
    const int64_t n = t.size(dim) / size;
    return t.detach().narrow(dim, rank * n, n).clone();
}

struct ColumnParallelLinearImpl : torch::nn::Module {
    ColumnParallelLinearImpl(torch::nn::LinearImpl& whole, DistContext& group) : group(&group) {
        weight = register_parameter("weight", shardOf(whole.weight, 0, group.rank(), group.worldSize()));
        if (whole.bias.defined())
            bias = register_parameter("bias", shardOf(whole.bias, 0, group.rank(), group.worldSize()));
    }
    torch::Tensor forward(torch::Tensor x) {
        return torch::nn::functional::linear(CopyToGroup::apply(x, groupHandle(*group)), weight, bias);
    }
    DistContext* group;
    torch::Tensor weight, bias;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearImpl : torch::nn::Module {
    RowParallelLinearImpl(torch::nn::LinearImpl& whole, DistContext& group) : group(&group) {
        weight = register_parameter("weight", shardOf(whole.weight, 1, group.rank(), group.worldSize()));
        if (whole.bias.defined()) bias = register_parameter("bias", whole.bias.detach().clone());
    }
    torch::Tensor forward(torch::Tensor x) {
        auto y = ReduceFromGroup::apply(torch::nn::functional::linear(x, weight), groupHandle(*group));
        return bias.defined() ? y + bias : y;  // once, after the sum
    }
    DistContext* group;
    torch::Tensor weight, bias;
};
TORCH_MODULE(RowParallelLinear);

// A hashed embedding table split by rows: each rank looks up only the rows it holds (others count
// as zero), and the per-sample sums are summed over the group.
struct ShardedEmbeddingImpl : torch::nn::Module {
    ShardedEmbeddingImpl(HashedEmbeddingImpl& whole, DistContext& group)
        : whole(std::dynamic_pointer_cast<HashedEmbeddingImpl>(whole.shared_from_this())), group(&group) {
        const int64_t n = whole.rows / group.worldSize();
        first = group.rank() * n;
        weight = register_parameter("weight", shardOf(whole.weight, 0, group.rank(), group.worldSize()));
    }
    torch::Tensor forward(torch::Tensor x) {
        const auto ids = whole->rowIds(x);
        const auto mine = (ids >= first).logical_and(ids < first + weight.size(0));
        const auto local = (ids - first).clamp(0, weight.size(0) - 1);
        auto rows = torch::embedding(weight, local) * mine.unsqueeze(-1).to(weight.scalar_type());
        return ReduceFromGroup::apply(rows.sum(1), groupHandle(*group));
    }
    std::shared_ptr<HashedEmbeddingImpl> whole;  // for the hashing only (its table is not used)
    DistContext* group;
    int64_t first = 0;
    torch::Tensor weight;
};
TORCH_MODULE(ShardedEmbedding);

torch::nn::AnyModule& layerAt(torch::nn::Sequential& model, int64_t i) { return *(model->begin() + i); }

}  // namespace

std::vector<TpSplit> planTensorParallel(torch::nn::Sequential& model, int64_t begin, int64_t end, int ranks) {
    std::vector<TpSplit> plan(model->size(), TpSplit::None);
    if (ranks <= 1) return plan;
    auto refuse = [&](int64_t i, const std::string& what, int64_t n) {
        throw ConfigError("`tensor_parallel` " + std::to_string(ranks) + ": layer " + std::to_string(i) +
                          "'s " + what + " (" + std::to_string(n) + ") is not a multiple of " +
                          std::to_string(ranks) + "; choose widths divisible by it");
    };
    bool open = false;  // a column-parallel layer waits for its row-parallel partner
    int64_t lastColumn = -1;
    bool any = false;
    for (int64_t i = begin; i < end; ++i) {
        const auto m = model->ptr(static_cast<size_t>(i));
        if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(m.get())) {
            if (!open) {
                if (lin->weight.size(0) % ranks != 0) refuse(i, "output features", lin->weight.size(0));
                plan[static_cast<size_t>(i)] = TpSplit::Column;
                lastColumn = i;
            } else {
                plan[static_cast<size_t>(i)] = TpSplit::Row;
                any = true;
            }
            open = !open;
        } else if (auto* emb = dynamic_cast<HashedEmbeddingImpl*>(m.get())) {
            if (emb->rows % ranks != 0) refuse(i, "embedding rows", emb->rows);
            plan[static_cast<size_t>(i)] = TpSplit::EmbeddingRows;
            any = true;
        } else if (!m->parameters().empty() && open) {
            // A layer with parameters between the pair (a quantization-aware or other layer):
            // the column layer's output would reach it split. Keep that one whole.
            plan[static_cast<size_t>(lastColumn)] = TpSplit::None;
            open = false;
        }
    }
    if (open) plan[static_cast<size_t>(lastColumn)] = TpSplit::None;  // an odd last Linear stays whole
    if (!any)
        throw ConfigError("`tensor_parallel` " + std::to_string(ranks) +
                          ": no pair of Linear layers (or embedding table) to split" +
                          (begin > 0 || end < static_cast<int64_t>(model->size()) ? " in this pipeline stage"
                                                                                  : std::string()) +
                          "; use a model with at least two Linear layers per stage");
    return plan;
}

torch::nn::Sequential tensorParallelModel(torch::nn::Sequential& model, int64_t begin, int64_t end,
                                          const std::vector<TpSplit>& plan, DistContext& group) {
    torch::nn::Sequential out;
    for (int64_t i = begin; i < end; ++i) {
        const std::string name = std::to_string(i);
        const auto m = model->ptr(static_cast<size_t>(i));
        switch (plan[static_cast<size_t>(i)]) {
            case TpSplit::Column:
                out->push_back(name, torch::nn::AnyModule(ColumnParallelLinear(
                                         *dynamic_cast<torch::nn::LinearImpl*>(m.get()), group)));
                break;
            case TpSplit::Row:
                out->push_back(name, torch::nn::AnyModule(RowParallelLinear(
                                         *dynamic_cast<torch::nn::LinearImpl*>(m.get()), group)));
                break;
            case TpSplit::EmbeddingRows:
                out->push_back(name, torch::nn::AnyModule(ShardedEmbedding(
                                         *dynamic_cast<HashedEmbeddingImpl*>(m.get()), group)));
                break;
            case TpSplit::None:
                out->push_back(name, layerAt(model, i));
                break;
        }
    }
    return out;
}

bool isShardedParameter(const torch::nn::Sequential& stage, const torch::Tensor& p) {
    for (const auto& m : stage->children()) {
        const bool sharded = dynamic_cast<ColumnParallelLinearImpl*>(m.get()) ||
                             dynamic_cast<ShardedEmbeddingImpl*>(m.get()) ||
                             (dynamic_cast<RowParallelLinearImpl*>(m.get()) &&
                              !dynamic_cast<RowParallelLinearImpl*>(m.get())->bias.is_same(p));
        if (!sharded) continue;
        for (const auto& q : m->parameters())
            if (q.is_same(p)) return true;
    }
    return false;
}

void mergeTensorParallel(torch::nn::Sequential& model, const std::vector<TpSplit>& plan, int64_t begin,
                         int64_t end, const std::vector<ShardState>& shards) {
    torch::NoGradGuard noGrad;
    if (plan.size() != model->size())
        throw CheckpointError("the checkpoint's tensor-parallel plan has " + std::to_string(plan.size()) +
                              " layers, the network " + std::to_string(model->size()));
    for (auto i = static_cast<size_t>(begin); i < static_cast<size_t>(end); ++i) {
        const std::string name = std::to_string(i);
        auto layer = model->ptr(i);
        auto params = layer->named_parameters(false);
        auto piece = [&](size_t t, const std::string& param) -> const torch::Tensor& {
            const auto it = shards[t].find(name);
            if (it == shards[t].end() || !it->second.count(param))
                throw CheckpointError("tensor-parallel shard " + std::to_string(t) + " has no " + name + "." +
                                      param);
            return it->second.at(param);
        };
        auto cat = [&](const std::string& param, int64_t dim) {
            std::vector<torch::Tensor> parts;
            for (size_t t = 0; t < shards.size(); ++t) parts.push_back(piece(t, param));
            return torch::cat(parts, dim);
        };
        for (auto& item : params) {
            torch::Tensor value;
            switch (plan[i]) {
                case TpSplit::Column:
                case TpSplit::EmbeddingRows:
                    value = cat(item.key(), 0);
                    break;
                case TpSplit::Row:
                    value = item.key() == "weight" ? cat("weight", 1) : piece(0, item.key());
                    break;
                case TpSplit::None:
                    value = piece(0, item.key());
                    break;
            }
            if (!value.sizes().equals(item.value().sizes()))
                throw CheckpointError("tensor-parallel shards of layer " + name + "." + item.key() +
                                      " make " + c10::str(value.sizes()) + ", the network has " +
                                      c10::str(item.value().sizes()));
            item.value().copy_(value);
        }
    }
}

}  // namespace lathe::core
