// Model artifacts as TorchScript archives. LibTorch's C++ modules cannot be scripted, so the
// exporter writes the forward pass of our zoo's layer sequence as TorchScript source and
// compiles it with Module::define: the result is an ordinary TorchScript file that
// torch.jit.load opens anywhere, with the weights as parameters and Lathe's metadata as an
// extra file.
#include "lathe/core/model_artifact.h"
#include "lathe/core/data_versions.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <variant>

#include "artifact_io.h"
#include "data/raw.h"
#include "lathe/core/sha256.h"
#include "lathe/core/store.h"
#include "torch_backend.h"
#include "training/checkpoint_io.h"
#include "training/zoo.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace lathe::core {
namespace {

constexpr const char* kMetaFile = "lathe_meta.json";

std::string datatypeOf(c10::ScalarType t) {
    switch (t) {
        case c10::kFloat:
            return "FP32";
        case c10::kDouble:
            return "FP64";
        case c10::kHalf:
            return "FP16";
        case c10::kBFloat16:
            return "BF16";
        case c10::kLong:
            return "INT64";
        case c10::kInt:
            return "INT32";
        case c10::kBool:
            return "BOOL";
        default:
            return "BYTES";
    }
}

std::string metaJson(const ArtifactInfo& info) {
    json j{{"format", kArtifactFormat}, {"signature", json::parse(signatureToJson(info.signature))},
           {"metrics", info.metrics},   {"run_id", info.runId},
           {"data", info.data},         {"source", info.source}};
    return j.dump(2);
}

// A signature a server can size its buffers from: at least one input and one output, each with
// the batch dimension first (-1), at most 8 dimensions, every other one fixed at 1..2^20 (an
// output's may be -1), and at most 2^24 values per row. A hostile or damaged file could otherwise
// make a server allocate max-batch x 2^40 floats when it loads the model.
void checkSignature(const ModelSignature& sig, const std::string& path) {
    if (sig.inputs.empty() || sig.outputs.empty())
        throw ConfigError("model artifact " + path + ": its signature lists no " +
                          (sig.inputs.empty() ? "input" : "output"));
    constexpr int64_t kMaxDim = int64_t{1} << 20, kMaxRow = int64_t{1} << 24;
    for (const auto* list : {&sig.inputs, &sig.outputs})
        for (const auto& t : *list) {
            const std::string what = "model artifact " + path + ": tensor '" + t.name + "' ";
            if (t.shape.empty() || t.shape.size() > 8 || t.shape[0] != -1)
                throw ConfigError(what + "must have 1 to 8 dimensions, the batch (-1) first");
            int64_t row = 1;
            for (size_t i = 1; i < t.shape.size(); ++i) {
                const auto d = t.shape[i];
                const bool dynamicOutput = list == &sig.outputs && d == -1;
                if (!dynamicOutput && (d < 1 || d > kMaxDim))
                    throw ConfigError(what + "has dimension " + std::to_string(d) + " (allowed: 1.." +
                                      std::to_string(kMaxDim) + ")");
                row *= dynamicOutput ? 1 : d;
                if (row > kMaxRow)
                    throw ConfigError(what + "holds more than " + std::to_string(kMaxRow) +
                                      " values per row");
            }
        }
}

void fillMeta(ArtifactInfo& info, const std::string& text, const std::string& path) {
    // Lathe writes a few kilobytes; a larger or deeply nested block is not ours (and nlohmann's
    // dump and copy recurse, so depth must be bounded before they run).
    if (text.size() > (size_t{1} << 20))
        throw ConfigError("model artifact " + path + " has " + std::to_string(text.size()) +
                          " bytes of Lathe metadata (at most 1 MiB)");
    try {
        const auto j = json::parse(text, [&](int depth, json::parse_event_t, json&) {
            if (depth > 16)
                throw ConfigError("model artifact " + path + " has Lathe metadata nested too deeply");
            return true;
        });
        if (!j.is_object())
            throw ConfigError("model artifact " + path + " has Lathe metadata that is not an object");
        const int format = j.at("format").get<int>();
        if (format > kArtifactFormat)
            throw ConfigError("model artifact " + path + " has format " + std::to_string(format) +
                              ", newer than this Lathe understands; upgrade Lathe");
        info.signature = signatureFromJson(j.at("signature").dump());
        checkSignature(info.signature, path);
        const json metrics = j.value("metrics", json::object());  // kept alive: items() refers to it
        for (const auto& [k, v] : metrics.items())
            if (v.is_number()) info.metrics[k] = v.get<double>();
        info.runId = j.value("run_id", int64_t{0});
        info.data = j.value("data", std::string());
        info.source = j.value("source", std::string());
    } catch (const json::exception& ex) {
        throw ConfigError("model artifact " + path + " has malformed Lathe metadata: " + ex.what());
    }
}

void finish(ArtifactInfo& info, const std::string& path) {
    info.path = path;
    info.sha256 = sha256File(path);
    std::error_code ec;
    info.sizeBytes = static_cast<int64_t>(fs::file_size(path, ec));
}

// Saves to a temporary name and renames, so a crash never leaves half an artifact.
void saveModule(const torch::jit::Module& m, const std::string& outPath, const std::string& meta) {
    std::error_code ec;
    fs::create_directories(fs::path(outPath).parent_path(), ec);
    const std::string tmp = outPath + ".tmp-" + std::to_string(::getpid());
    try {
        m.save(tmp, {{kMetaFile, meta}});
    } catch (const c10::Error& ex) {
        fs::remove(tmp, ec);
        throw Error("cannot write model artifact " + outPath + ": " + ex.what_without_backtrace());
    }
    fs::rename(tmp, outPath, ec);
    if (ec) {
        fs::remove(tmp, ec);
        throw Error("cannot move model artifact into place at " + outPath + ": " + ec.message());
    }
}

std::string intList(std::initializer_list<int64_t> v) {
    std::string s = "[";
    for (auto x : v) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
    return s + "]";
}

// TorchScript for the zoo's Sequential: one statement per layer, weights as parameters.
torch::jit::Module scriptSequential(torch::nn::Sequential& seq, const data::SplitSet& split) {
    torch::jit::Module m("LatheModel");
    std::ostringstream src;
    src << "def forward(self, x: Tensor) -> Tensor:\n";
    if (!split.mean.empty()) {
        // csv data was standardised with the training split's statistics: apply the same to raw input.
        m.register_buffer("input_mean", torch::tensor(split.mean));
        m.register_buffer("input_std", torch::tensor(split.stddev));
        src << "    x = (x - self.input_mean) / self.input_std\n";
    }
    int i = 0;
    for (const auto& layer : *seq) {
        const auto* p = layer.ptr().get();
        const std::string n = "l" + std::to_string(i++);
        if (dynamic_cast<const torch::nn::FlattenImpl*>(p)) {
            src << "    x = torch.flatten(x, 1)\n";
        } else if (const auto* lin = dynamic_cast<const torch::nn::LinearImpl*>(p)) {
            m.register_parameter(n + "_weight", lin->weight.detach().clone(), false);
            m.register_parameter(n + "_bias", lin->bias.detach().clone(), false);
            src << "    x = torch.addmm(self." << n << "_bias, x, self." << n << "_weight.t())\n";
        } else if (const auto* emb = dynamic_cast<const HashedEmbeddingImpl*>(p)) {
            // The same bins and hash as HashedEmbeddingImpl::rowIds, written out.
            m.register_parameter(n + "_weight", emb->weight.detach().clone(), false);
            const auto bins = std::to_string(HashedEmbeddingImpl::kBins);
            src << "    ids = torch.clamp(torch.floor(torch.flatten(x, 1) * " << bins << ".0), 0, "
                << HashedEmbeddingImpl::kBins - 1 << ").long()\n"
                << "    ids = torch.remainder((torch.arange(" << emb->features
                << ", device=x.device).unsqueeze(0) * " << bins << " + ids) * "
                << HashedEmbeddingImpl::kHashMultiplier << ", " << emb->rows << ")\n"
                << "    x = torch.embedding(self." << n << "_weight, ids, -1, False, False).sum(1)\n";
        } else if (dynamic_cast<const torch::nn::ReLUImpl*>(p)) {
            src << "    x = torch.relu(x)\n";
        } else if (const auto* conv = dynamic_cast<const torch::nn::Conv2dImpl*>(p)) {
            const auto& o = conv->options;
            // padding_t is a c10::variant in LibTorch 1.x and a std::variant in 2.x: with std::get
            // visible, argument-dependent lookup picks whichever `get` the type belongs to.
            using std::get;
            const auto& pad = get<torch::ExpandingArray<2>>(o.padding());
            m.register_parameter(n + "_weight", conv->weight.detach().clone(), false);
            m.register_parameter(n + "_bias", conv->bias.detach().clone(), false);
            src << "    x = torch.conv2d(x, self." << n << "_weight, self." << n << "_bias, "
                << intList({o.stride()->at(0), o.stride()->at(1)}) << ", "
                << intList({pad->at(0), pad->at(1)}) << ", "
                << intList({o.dilation()->at(0), o.dilation()->at(1)}) << ", " << o.groups() << ")\n";
        } else if (const auto* pool = dynamic_cast<const torch::nn::MaxPool2dImpl*>(p)) {
            const auto& o = pool->options;
            src << "    x = torch.max_pool2d(x, " << intList({o.kernel_size()->at(0), o.kernel_size()->at(1)})
                << ", " << intList({o.stride()->at(0), o.stride()->at(1)}) << ", "
                << intList({o.padding()->at(0), o.padding()->at(1)}) << ", "
                << intList({o.dilation()->at(0), o.dilation()->at(1)}) << ", "
                << (o.ceil_mode() ? "True" : "False") << ")\n";
        } else {
            throw Error("cannot export layer '" + layer.ptr()->name() + "' to TorchScript");
        }
    }
    src << "    return x\n";
    m.define(src.str());
    m.eval();
    return m;
}

std::string readFileBytes(const std::string& path, size_t maxBytes) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) throw ConfigError("cannot read " + path + ": " + ec.message());
    if (size > maxBytes)
        throw ConfigError(path + " is larger than " + std::to_string(maxBytes >> 20) + " MiB");
    std::ifstream in(path, std::ios::binary);
    std::string s(size, '\0');
    in.read(s.data(), static_cast<std::streamsize>(size));
    return s;
}

torch::jit::Module loadScript(const std::string& path, torch::jit::ExtraFilesMap& extra,
                              const c10::Device& device = torch::kCPU) {
    if (!fs::is_regular_file(path)) throw ConfigError("no model file at " + path);
    try {
        return torch::jit::load(path, device, extra);
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw ConfigError(
            path + " is not a TorchScript model (save one with torch.jit.trace(model, x).save(path)): " +
            msg.substr(0, msg.find('\n')));
    } catch (const Error&) {
        throw;
    } catch (const std::exception& ex) {
        // The archive read but its code did not: TorchScript's lexer and parser report with
        // their own std::exception (torch::jit::ErrorReport), a damaged pickle with others.
        std::string msg = ex.what();
        msg.erase(0, msg.find_first_not_of(" \n"));  // ErrorReport's message starts with a newline
        msg = msg.substr(0, msg.find('\n'));
        if (msg.rfind("Unknown builtin op", 0) == 0)
            throw ConfigError(path + " uses an operator this program does not have (" + msg +
                              "): a custom op whose library is not loaded here");
        throw ConfigError(path + " is not a readable TorchScript model (damaged code or data" +
                          (msg.empty() ? std::string(")") : "): " + msg));
    }
}

}  // namespace

namespace {

// Scripts a zoo network (eval mode) with its standardisation folded in, checks the script computes
// what the network does on validation rows, and saves it as an artifact with `info`'s metadata
// plus the signature.
ArtifactInfo scriptAndSave(torch::nn::Sequential model, const RunSpec& spec, const data::SplitSet& split,
                           ArtifactInfo info, const std::string& outPath, const std::string& what) {
    const auto classes = static_cast<int64_t>(split.train.classNames.size());
    std::vector<int64_t> inShape{-1};
    inShape.insert(inShape.end(), split.train.shape.begin(), split.train.shape.end());
    info.signature.inputs = {{"input", "FP32", inShape}};
    info.signature.outputs = {{"logits", "FP32", {-1, classes}}};
    info.signature.classNames = split.train.classNames;
    info.data = spec.data;

    torch::NoGradGuard noGrad;
    auto scripted = scriptSequential(model, split);
    // The scripted forward must compute what the trained model computes.
    const auto n = std::min<int64_t>(split.val.size(), 64);
    if (n > 0) {
        std::vector<int64_t> shape{n};
        shape.insert(shape.end(), split.val.shape.begin(), split.val.shape.end());
        auto x = torch::from_blob(const_cast<float*>(split.val.x.data()), shape, torch::kFloat).clone();
        // The zoo model saw standardised data; the scripted one standardises raw input itself.
        auto raw = x;
        if (!split.mean.empty()) raw = x * torch::tensor(split.stddev) + torch::tensor(split.mean);
        const auto expected = model->forward(x);
        const auto got = scripted.forward({raw}).toTensor();
        if (!torch::allclose(expected, got, 1e-4, 1e-4))
            throw Error("exported TorchScript of " + what + " disagrees with the model");
    }
    saveModule(scripted, outPath, metaJson(info));
    finish(info, outPath);
    return info;
}

}  // namespace

ArtifactInfo torch_impl::exportRunModel(const Store& store, int64_t runId, const std::string& outPath) {
    const auto run = store.run(runId);
    if (!run) throw NotFoundError("no run " + std::to_string(runId) + " in workspace " + store.path());
    std::string checkpoint;
    for (const auto& a : store.artifacts(runId))
        if (a.kind == "checkpoint") checkpoint = a.path;  // the newest
    if (checkpoint.empty())
        throw NotFoundError("run " + std::to_string(runId) + " (" + toString(run->status) +
                            ") has no checkpoint to export; train with checkpoints (the default, "
                            "--checkpoint-every 1) or resume it to completion");
    const RunSpec spec = parseRunSpec(run->config, "run " + std::to_string(runId) + " config");
    const auto split =
        data::loadSplit(bindDataSet(spec, store.path()).used);  // dataset:NAME:V where its files are
    const auto classes = static_cast<int64_t>(split.train.classNames.size());
    auto model = makeModel(spec, split.train.shape, classes);
    loadModelWeights(checkpoint, *model);
    if (spec.qat) {
        // A quantization-aware run exports its fp32 weights as the plain network (the int8 model
        // is made from them by compress quantize --mode qat).
        RunSpec plain = spec;
        plain.qat = false;
        auto fp32 = makeModel(plain, split.train.shape, classes);
        copyParameters(*model, *fp32);
        model = fp32;
    }
    model->eval();

    ArtifactInfo info;
    for (const auto& [k, v] : store.lastMetrics(runId))
        if (k.rfind("val/", 0) == 0 || k == "train/loss") info.metrics[k] = v;
    info.runId = runId;
    info.source =
        "run " + std::to_string(runId) + " (" + run->name + ", " + spec.model + " on " + spec.data + ")";
    return scriptAndSave(model, spec, split, info, outPath, "run " + std::to_string(runId));
}

ArtifactInfo torch_impl::exportSpecModel(const RunSpec& spec, const std::string& outPath) {
    torch_impl::checkRunnable(spec);
    torch::manual_seed(static_cast<uint64_t>(spec.seed));
    const auto split = data::loadSplit(spec);
    const auto classes = static_cast<int64_t>(split.train.classNames.size());
    auto model = makeModel(spec, split.train.shape, classes);
    model->eval();
    ArtifactInfo info;
    info.source =
        "untrained " + spec.model + " for " + spec.data + " (seed " + std::to_string(spec.seed) + ")";
    return scriptAndSave(model, spec, split, info, outPath, "the " + spec.model + " network");
}

ArtifactInfo torch_impl::importTorchScript(const std::string& file, const std::vector<int64_t>& inputShape,
                                           const std::string& outPath) {
    torch::jit::ExtraFilesMap extra{{kMetaFile, ""}};
    auto m = loadScript(file, extra);
    ArtifactInfo info;
    if (!extra[kMetaFile].empty()) {
        fillMeta(info, extra[kMetaFile], file);
        if (!inputShape.empty()) {
            std::vector<int64_t> s{-1};
            s.insert(s.end(), inputShape.begin(), inputShape.end());
            if (info.signature.inputs.empty() || info.signature.inputs[0].shape != s)
                throw ConfigError(file + " is a Lathe artifact whose input shape differs from --input-shape");
        }
    } else {
        if (inputShape.empty())
            throw ConfigError(file +
                              " has no Lathe metadata: give one sample's input shape with --input-shape "
                              "(e.g. --input-shape 64 or --input-shape 3,224,224)");
        int64_t row = 1;
        for (auto d : inputShape) {
            if (d <= 0 || d > (1 << 20)) throw ConfigError("--input-shape dimensions must be 1..1048576");
            row *= d;
            if (row > (int64_t{1} << 24))
                throw ConfigError("--input-shape holds more than 2^24 values per sample");
        }
        std::vector<int64_t> shape{1};
        shape.insert(shape.end(), inputShape.begin(), inputShape.end());
        torch::Tensor out;
        try {
            torch::NoGradGuard g;
            m.eval();
            auto r = m.forward({torch::zeros(shape)});
            if (!r.isTensor()) throw ConfigError(file + ": forward must return one tensor");
            out = r.toTensor();
        } catch (const c10::Error& ex) {
            std::string msg = ex.what_without_backtrace();
            throw ConfigError(file + " does not accept input of shape [N, " +
                              std::to_string(inputShape.size()) +
                              " dims given by --input-shape]: " + msg.substr(0, msg.find('\n')));
        }
        std::vector<int64_t> in{-1};
        in.insert(in.end(), inputShape.begin(), inputShape.end());
        std::vector<int64_t> outShape{-1};
        for (int64_t i = 1; i < out.dim(); ++i) outShape.push_back(out.size(i));
        info.signature.inputs = {{"input", "FP32", in}};
        info.signature.outputs = {{"output", datatypeOf(out.scalar_type()), outShape}};
        checkSignature(info.signature, file);
    }
    // The run that made a file belongs to the workspace it came from: here it would name another
    // run with the same number, or none (a foreign-key failure). It is kept only in the source.
    const int64_t fromRun = info.runId;
    info.runId = 0;
    info.source =
        "file " + fs::absolute(file).lexically_normal().string() +
        (fromRun > 0 ? " (exported from run " + std::to_string(fromRun) + " of another workspace)" : "");
    saveModule(m, outPath, metaJson(info));
    finish(info, outPath);
    return info;
}

torch::jit::Module loadArtifact(const std::string& path, const c10::Device& device, ArtifactInfo& info) {
    torch::jit::ExtraFilesMap extra{{kMetaFile, ""}};
    auto m = loadScript(path, extra, device);
    if (extra[kMetaFile].empty())
        throw ConfigError(path +
                          " is a TorchScript file without Lathe metadata: register it first "
                          "(lathectl models register NAME --file " +
                          path + " --input-shape ...)");
    fillMeta(info, extra[kMetaFile], path);
    return m;
}

torch::jit::Module loadAnyScript(const std::string& path, const c10::Device& device, ArtifactInfo& info,
                                 bool& hasMeta) {
    torch::jit::ExtraFilesMap extra{{kMetaFile, ""}};
    auto m = loadScript(path, extra, device);
    hasMeta = !extra[kMetaFile].empty();
    if (hasMeta) fillMeta(info, extra[kMetaFile], path);
    return m;
}

ArtifactInfo torch_impl::readArtifact(const std::string& path) {
    ArtifactInfo info;
    loadArtifact(path, torch::kCPU, info);
    finish(info, path);
    return info;
}

namespace {

// A unique temporary artifact name in a model's folder, after clearing temporaries of
// registrations that were killed (an hour old): of no use to anyone.
std::string incomingPath(const fs::path& dir) {
    std::error_code ec;
    const auto hourAgo = fs::file_time_type::clock::now() - std::chrono::hours(1);
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().filename().string().rfind(".incoming-", 0) == 0 && e.last_write_time(ec) < hourAgo)
            fs::remove(e.path(), ec);
    return (dir / (".incoming-" + std::to_string(::getpid()) + "-" +
                   std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + ".pt"))
        .string();
}

// Renames the finished temporary to its content hash (two registrations racing each other never
// overwrite one another's file) and adds the version; `v` carries the lineage fields.
ModelVersion placeAndAdd(Registry& registry, const fs::path& dir, const std::string& tmp,
                         const ArtifactInfo& info, ModelVersion v) {
    const auto final = (dir / (info.sha256.substr(0, 16) + ".pt")).string();
    std::error_code ec;
    const bool existed = fs::exists(final, ec);  // an earlier version with the same content
    fs::rename(tmp, final, ec);
    if (ec) {
        fs::remove(tmp, ec);
        throw Error("cannot move model artifact into place at " + final + ": " + ec.message());
    }
    v.path = final;
    v.sha256 = info.sha256;
    v.sizeBytes = info.sizeBytes;
    v.signature = info.signature;
    v.metrics = info.metrics;
    v.runId = info.runId;
    v.data = info.data;
    v.source = info.source;
    try {
        return registry.addVersion(v);
    } catch (...) {
        if (!existed) fs::remove(final, ec);  // no version refers to it
        throw;
    }
}

}  // namespace

ModelVersion torch_impl::registerModel(Registry& registry, const Store* store, const std::string& name,
                                       int64_t runId, const std::string& file,
                                       const std::vector<int64_t>& inputShape, int64_t parentVersion) {
    checkModelName(name);
    if ((runId > 0) == !file.empty()) throw ConfigError("register a model from either --run or --file");
    if (runId > 0 && !store) throw ConfigError("registering a run's model needs its workspace");
    if (parentVersion > 0)
        registry.resolve({name, parentVersion, {}});  // NotFoundError before any file is written
    const auto dir = fs::path(registry.modelDir(name));
    const auto tmp = incomingPath(dir);
    ArtifactInfo info = runId > 0 ? torch_impl::exportRunModel(*store, runId, tmp)
                                  : torch_impl::importTorchScript(file, inputShape, tmp);
    ModelVersion v;
    v.name = name;
    v.parentVersion = parentVersion;
    return placeAndAdd(registry, dir, tmp, info, v);
}

ModelVersion registerModule(Registry& registry, const std::string& name, const torch::jit::Module& module,
                            ArtifactInfo info, const ModelVersion& lineage) {
    checkModelName(name);
    const auto dir = fs::path(registry.modelDir(name));
    std::error_code ec;
    fs::create_directories(dir, ec);
    const auto tmp = incomingPath(dir);
    saveModule(module, tmp, metaJson(info));
    finish(info, tmp);
    ModelVersion v = lineage;
    v.name = name;
    return placeAndAdd(registry, dir, tmp, info, v);
}

}  // namespace lathe::core
