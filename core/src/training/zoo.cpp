#include "training/zoo.h"

#include <ATen/Context.h>
#include <torch/script.h>

#include <cmath>
#include <map>
#include <mutex>

#include "compression/fake_quant.h"
#include "lathe/core/error.h"
#include "training/amp.h"

namespace lathe::core {
namespace {

// Linear and Conv2d, or their quantization-aware forms (spec.qat), which have the same
// parameters and export as the same layers.
void addLinear(torch::nn::Sequential& seq, const RunSpec& spec, int64_t in, int64_t out) {
    if (spec.qat)
        seq->push_back(std::make_shared<compression::QatLinearImpl>(torch::nn::LinearOptions(in, out)));
    else
        seq->push_back(torch::nn::Linear(in, out));
}

void addConv(torch::nn::Sequential& seq, const RunSpec& spec, const torch::nn::Conv2dOptions& options) {
    if (spec.qat)
        seq->push_back(std::make_shared<compression::QatConv2dImpl>(options));
    else
        seq->push_back(torch::nn::Conv2d(options));
}

torch::nn::Sequential mlp(const RunSpec& spec, int64_t inputs, int64_t classes) {
    torch::nn::Sequential seq;
    seq->push_back(torch::nn::Flatten());
    int64_t width = inputs;
    for (int64_t h : spec.hidden) {
        addLinear(seq, spec, width, h);
        seq->push_back(torch::nn::ReLU());
        width = h;
    }
    addLinear(seq, spec, width, classes);
    return seq;
}

// LeNet-style: conv/ReLU/pool stages (spec.channels, 16 and 32 by default) then linear layers
// (spec.head, 64 by default). Pooling stops once the feature map is 2×2, so 8×8 digits and
// 28×28 MNIST both fit.
torch::nn::Sequential cnn(const RunSpec& spec, const std::vector<int64_t>& shape, int64_t classes) {
    const int64_t c = shape[0], h = shape[1], w = shape[2];
    torch::nn::Sequential seq;
    int64_t ch = c, hh = h, ww = w;
    for (int64_t out : spec.channels) {
        addConv(seq, spec, torch::nn::Conv2dOptions(ch, out, 3).padding(1));
        seq->push_back(torch::nn::ReLU());
        if (hh >= 4 && ww >= 4) {
            seq->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
            hh /= 2;
            ww /= 2;
        }
        ch = out;
    }
    seq->push_back(torch::nn::Flatten());
    int64_t width = ch * hh * ww;
    for (int64_t out : spec.head) {
        addLinear(seq, spec, width, out);
        seq->push_back(torch::nn::ReLU());
        width = out;
    }
    addLinear(seq, spec, width, classes);
    return seq;
}

torch::nn::Sequential embed(const RunSpec& spec, int64_t inputs, int64_t classes, bool sparse) {
    torch::nn::Sequential seq;
    int64_t width = spec.hidden.front();
    seq->push_back(HashedEmbedding(inputs, spec.embeddingRows, width, sparse));
    seq->push_back(torch::nn::ReLU());
    for (size_t i = 1; i < spec.hidden.size(); ++i) {
        seq->push_back(torch::nn::Linear(width, spec.hidden[i]));
        seq->push_back(torch::nn::ReLU());
        width = spec.hidden[i];
    }
    seq->push_back(torch::nn::Linear(width, classes));
    return seq;
}

}  // namespace

HashedEmbeddingImpl::HashedEmbeddingImpl(int64_t features, int64_t rows, int64_t dim, bool sparse)
    : features(features), rows(rows), sparse(sparse) {
    // Each sample sums `features` rows: scaled so the sum starts with about unit variance.
    weight =
        register_parameter("weight", torch::randn({rows, dim}) / std::sqrt(static_cast<double>(features)));
}

torch::Tensor HashedEmbeddingImpl::rowIds(const torch::Tensor& x) const {
    const auto bins =
        (x.flatten(1) * static_cast<double>(kBins)).floor().clamp(0, kBins - 1).to(torch::kLong);
    const auto feature = torch::arange(features, x.options().dtype(torch::kLong)).unsqueeze(0);
    return ((feature * kBins + bins) * kHashMultiplier).remainder(rows);
}

torch::Tensor HashedEmbeddingImpl::forward(torch::Tensor x) {
    return torch::embedding(weight, rowIds(x), -1, false, sparse).sum(1);
}

std::vector<size_t> sparseParameterIndices(torch::nn::Sequential& model) {
    std::vector<size_t> out;
    const auto params = model->parameters();
    for (const auto& m : model->modules(false))
        if (const auto* e = dynamic_cast<const HashedEmbeddingImpl*>(m.get()); e && e->sparse)
            for (size_t i = 0; i < params.size(); ++i)
                if (params[i].is_same(e->weight)) out.push_back(i);
    return out;
}

torch::nn::Sequential makeModel(const RunSpec& spec, const std::vector<int64_t>& sampleShape,
                                int64_t numClasses, bool sparseEmbedding) {
    int64_t inputs = 1;
    for (auto s : sampleShape) inputs *= s;
    if (spec.model == "mlp") return mlp(spec, inputs, numClasses);
    if (spec.model == "embed") return embed(spec, inputs, numClasses, sparseEmbedding);
    if (spec.model == "cnn") {
        if (sampleShape.size() != 3)
            throw ConfigError("model cnn needs image data (C×H×W); data set " + spec.data + " has " +
                              std::to_string(inputs) + " flat features: use model = \"mlp\"");
        if (sampleShape[1] < 2 || sampleShape[2] < 2)
            throw ConfigError("model cnn needs images of at least 2×2 pixels");
        return cnn(spec, sampleShape, numClasses);
    }
    throw ConfigError("`model` must be one of mlp, cnn, embed (got '" + spec.model + "')");
}

int64_t parameterCount(const torch::nn::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
}

namespace {

torch::Tensor runRange(torch::nn::Sequential& model, int64_t begin, int64_t end, torch::Tensor x) {
    for (int64_t i = begin; i < end; ++i) x = (model->begin() + i)->forward(x);
    return x;
}

// The default generators a range's random ops (dropout) draw from: the CPU's, and that of the
// GPU the range's input is on (by index: backward runs on the autograd engine's thread for that
// device, whose current device need not be the one forward ran on).
std::vector<at::Generator> generators(c10::Device device) {
    std::vector<at::Generator> g{at::globalContext().defaultGenerator(c10::DeviceType::CPU)};
    if (device.is_cuda()) g.push_back(at::globalContext().defaultGenerator(device));
    return g;
}

std::vector<torch::Tensor> rngStates(c10::Device device) {
    std::vector<torch::Tensor> states;
    for (auto& g : generators(device)) {
        std::lock_guard<std::mutex> lk(g.mutex());
        states.push_back(g.get_state());
    }
    return states;
}

void setRngStates(c10::Device device, const std::vector<torch::Tensor>& states) {
    auto g = generators(device);
    for (size_t i = 0; i < g.size() && i < states.size(); ++i) {
        std::lock_guard<std::mutex> lk(g[i].mutex());
        g[i].set_state(states[i]);
    }
}

// LibTorch's C++ API has no checkpoint(): this autograd function runs a range of the model
// without recording a graph, keeps only the range's input, and in backward recomputes the
// range with grad enabled and back-propagates through it (reentrant, as torch.utils.checkpoint
// does with use_reentrant=True). As torch.utils.checkpoint's preserve_rng_state, the recompute
// replays the random numbers the forward drew (a dropout draws the same mask) and then puts the
// generators back where they were.
struct CheckpointRange : torch::autograd::Function<CheckpointRange> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input, int64_t modelPtr,
                                 int64_t begin, int64_t end, int64_t autocastDtype, int64_t device,
                                 bool inputGrad) {
        ctx->save_for_backward({input});
        ctx->saved_data["model"] = modelPtr;
        ctx->saved_data["begin"] = begin;
        ctx->saved_data["end"] = end;
        ctx->saved_data["autocast"] = autocastDtype;
        ctx->saved_data["device"] = device;
        ctx->saved_data["input_grad"] = inputGrad;
        const auto where = input.device();
        ctx->saved_data["rng_type"] = static_cast<int64_t>(where.type());
        ctx->saved_data["rng_index"] = static_cast<int64_t>(where.index());
        ctx->saved_data["rng"] = c10::List<torch::Tensor>(rngStates(where));
        auto& model = *reinterpret_cast<torch::nn::Sequential*>(modelPtr);
        return runRange(model, begin, end, input);
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        // The batch entering the first range requires grad only so that this function runs in
        // backward; nobody uses its gradient, so it is not computed.
        const bool inputGrad = ctx->saved_data["input_grad"].toBool();
        auto input = ctx->get_saved_variables()[0].detach().requires_grad_(inputGrad);
        auto& model = *reinterpret_cast<torch::nn::Sequential*>(ctx->saved_data["model"].toInt());
        const auto begin = ctx->saved_data["begin"].toInt(), end = ctx->saved_data["end"].toInt();
        const auto dtype = ctx->saved_data["autocast"].toInt();
        const auto device = static_cast<c10::DeviceType>(ctx->saved_data["device"].toInt());
        const c10::Device rngDevice(static_cast<c10::DeviceType>(ctx->saved_data["rng_type"].toInt()),
                                    static_cast<c10::DeviceIndex>(ctx->saved_data["rng_index"].toInt()));
        std::vector<torch::Tensor> forwardRng;
        for (const auto& t : ctx->saved_data["rng"].toTensorList()) forwardRng.push_back(t);
        torch::Tensor out;
        {
            torch::AutoGradMode enable(true);
            std::optional<AutocastGuard> cast;
            if (dtype >= 0) cast.emplace(device, static_cast<c10::ScalarType>(dtype));
            const auto now = rngStates(rngDevice);
            setRngStates(rngDevice, forwardRng);
            try {
                out = runRange(model, begin, end, input);
            } catch (...) {
                setRngStates(rngDevice, now);
                throw;
            }
            setRngStates(rngDevice, now);
        }
        if (!out.requires_grad())
            return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
                    torch::Tensor(), torch::Tensor(), torch::Tensor()};
        torch::autograd::backward({out}, {grads[0]});
        return {inputGrad ? input.grad() : torch::Tensor(),
                torch::Tensor(),
                torch::Tensor(),
                torch::Tensor(),
                torch::Tensor(),
                torch::Tensor(),
                torch::Tensor()};
    }
};

bool endsBlock(torch::nn::Sequential& model, size_t i) {
    const auto* m = model->ptr(i).get();
    const bool relu = dynamic_cast<const torch::nn::ReLUImpl*>(m) != nullptr;
    const bool pool = dynamic_cast<const torch::nn::MaxPool2dImpl*>(m) != nullptr;
    const bool nextIsPool = i + 1 < model->size() &&
                            dynamic_cast<const torch::nn::MaxPool2dImpl*>(model->ptr(i + 1).get()) != nullptr;
    return (relu && !nextIsPool) || pool;
}

}  // namespace

torch::Tensor forwardWithBlocks(torch::nn::Sequential& model, const torch::Tensor& x,
                                std::vector<torch::Tensor>& blocks) {
    blocks.clear();
    torch::Tensor h = x;
    for (size_t i = 0; i < model->size(); ++i) {
        h = (model->begin() + static_cast<int64_t>(i))->forward(h);
        if (endsBlock(model, i)) blocks.push_back(h);
    }
    return h;
}

void loadInitialWeights(torch::nn::Sequential& model, const std::string& artifactPath) {
    torch::jit::Module source;
    try {
        source = torch::jit::load(artifactPath, torch::kCPU);
    } catch (const c10::Error& ex) {
        const std::string msg = ex.what_without_backtrace();
        throw ConfigError("`init_from` " + artifactPath +
                          " is not a model artifact Lathe can read: " + msg.substr(0, msg.find('\n')));
    }
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& p : source.named_parameters(/*recurse=*/false)) tensors[p.name] = p.value;
    torch::NoGradGuard noGrad;
    for (size_t i = 0; i < model->size(); ++i) {
        for (auto& p : model->ptr(i)->named_parameters(/*recurse=*/false)) {
            const std::string name = "l" + std::to_string(i) + "_" + p.key();
            const auto it = tensors.find(name);
            const std::string layer = "layer " + std::to_string(i) + " (" + model->ptr(i)->name() + ")";
            if (it == tensors.end())
                throw ConfigError("`init_from` " + artifactPath + " has no " + p.key() + " for " + layer +
                                  ": it is not an fp32 model exported from a run of this network");
            if (it->second.sizes() != p.value().sizes())
                throw ConfigError("`init_from` " + artifactPath + ": " + layer + " " + p.key() + " is " +
                                  c10::str(it->second.sizes()) + " there and " + c10::str(p.value().sizes()) +
                                  " in this network (another model, hidden widths or channels?)");
            p.value().copy_(it->second.to(p.value().dtype()));
        }
    }
}

void copyParameters(torch::nn::Module& from, torch::nn::Module& to) {
    auto target = to.named_parameters();
    torch::NoGradGuard noGrad;
    for (const auto& p : from.named_parameters()) {
        auto* t = target.find(p.key());
        if (!t || t->sizes() != p.value().sizes())
            throw Error("cannot copy parameter " + p.key() + ": the networks differ");
        t->copy_(p.value());
    }
}

torch::Tensor forwardModel(torch::nn::Sequential& model, const torch::Tensor& x,
                           const ForwardOptions& options) {
    if (!options.checkpoint || !torch::GradMode::is_enabled()) return model->forward(x);
    // Block boundaries: after each activation (and its pool). The head after the last block
    // runs normally.
    std::vector<int64_t> ends;
    for (size_t i = 0; i < model->size(); ++i)
        if (endsBlock(model, i)) ends.push_back(static_cast<int64_t>(i) + 1);
    const auto blocks = static_cast<int64_t>(ends.size());
    if (blocks == 0) return model->forward(x);
    const auto segments = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(blocks))));
    const auto perSegment = (blocks + segments - 1) / segments;
    const int64_t dtype = options.autocast ? static_cast<int64_t>(*options.autocast) : -1;
    if (perSegment > blocks - 1) return model->forward(x);  // one segment: nothing to checkpoint
    // A custom function whose inputs need no grad is never called in backward (its range's
    // parameters would get no gradients), so the data entering the first segment is marked as
    // requiring grad, as torch.utils.checkpoint asks of its users.
    const bool inputGrad = x.requires_grad();
    torch::Tensor h = inputGrad ? x : x.detach().requires_grad_(true);
    int64_t begin = 0;
    // The last segment runs normally, as checkpoint_sequential does: its activations are the
    // first ones backward needs, so recomputing them would cost time and save no peak memory.
    for (int64_t b = perSegment - 1; b < blocks - 1; b += perSegment) {
        const int64_t end = ends[static_cast<size_t>(b)];
        h = CheckpointRange::apply(h, reinterpret_cast<int64_t>(&model), begin, end, dtype,
                                   static_cast<int64_t>(options.device), begin == 0 ? inputGrad : true);
        begin = end;
    }
    return runRange(model, begin, static_cast<int64_t>(model->size()), h);
}

}  // namespace lathe::core
