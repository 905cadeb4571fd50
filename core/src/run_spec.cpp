#include "lathe/core/run_spec.h"

#include "lathe/core/data_versions.h"

#include <toml++/toml.h>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

#include "data/cache.h"
#include "data/pipeline.h"
#include "lathe/core/error.h"

namespace lathe::core {
namespace {

struct KeyDef {
    SpecKey info;
    std::function<std::string(const RunSpec&)> get;
    std::function<void(RunSpec&, const std::string&)> set;  // throws ConfigError("`key` ...")
};

std::string quoteKey(const std::string& k) { return "`" + k + "`"; }

std::string fmtDouble(double v) {
    char buf[64];
    if (v == std::floor(v) && std::fabs(v) < 1e15) {
        std::snprintf(buf, sizeof buf, "%.0f", v);
        return buf;
    }
    std::snprintf(buf, sizeof buf, "%.17g", v);
    // Prefer the shortest text that reads back to the same double (0.001, not 0.0010000000000000000208).
    for (int prec = 1; prec <= 17; ++prec) {
        char shortBuf[64];
        std::snprintf(shortBuf, sizeof shortBuf, "%.*g", prec, v);
        if (std::strtod(shortBuf, nullptr) == v) return shortBuf;
    }
    return buf;
}

int64_t parseInt(const std::string& key, const std::string& text, int64_t lo, int64_t hi) {
    const std::string range = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    if (text.empty()) throw ConfigError(quoteKey(key) + " must be " + range + " (got nothing)");
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end == text.c_str() || *end != '\0')
        throw ConfigError(quoteKey(key) + " must be " + range + " (got '" + text + "')");
    if (v < lo || v > hi) throw ConfigError(quoteKey(key) + " must be " + range + " (got " + text + ")");
    return v;
}

// A float within bounds; `loOpen`/`hiOpen` say whether the bound itself is excluded.
double parseFloat(const std::string& key, const std::string& text, double lo, bool loOpen, double hi,
                  bool hiOpen) {
    std::string range = "a number ";
    range += loOpen ? "> " : ">= ";
    range += fmtDouble(lo);
    if (std::isfinite(hi)) range += std::string(hiOpen ? " and < " : " and <= ") + fmtDouble(hi);
    if (text.empty()) throw ConfigError(quoteKey(key) + " must be " + range + " (got nothing)");
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (errno != 0 || end == text.c_str() || *end != '\0' || !std::isfinite(v))
        throw ConfigError(quoteKey(key) + " must be " + range + " (got '" + text + "')");
    const bool below = loOpen ? !(v > lo) : !(v >= lo);
    const bool above = hiOpen ? !(v < hi) : !(v <= hi);
    if (below || above) throw ConfigError(quoteKey(key) + " must be " + range + " (got " + text + ")");
    return v;
}

std::string parseChoice(const std::string& key, const std::string& text,
                        const std::vector<std::string>& choices) {
    for (const auto& c : choices)
        if (c == text) return text;
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    throw ConfigError(quoteKey(key) + " must be one of " + list + " (got '" + text + "')");
}

std::string checkData(const std::string& text) {
    if (text == "digits" || text == "synthetic:spirals") return text;
    auto hasPrefix = [&](const char* p) { return text.rfind(p, 0) == 0; };
    if ((hasPrefix("csv:") || hasPrefix("idx:")) && text.size() > 4) return text;
    if (hasPrefix("images:") && text.size() > 7) return text;
    if (hasPrefix("dataset:")) {
        parseDataRef(text.substr(8));  // ConfigError saying what is wrong with NAME[:V]
        return text;
    }
    throw ConfigError(
        "`data` must be digits, synthetic:spirals, csv:PATH, idx:DIR, images:DIR or dataset:NAME[:V] (got '" +
        text + "')");
}

std::vector<int64_t> parseIntList(const std::string& key, const std::string& text, int64_t lo = 1,
                                  int64_t hi = 65536, size_t maxItems = 16) {
    std::vector<int64_t> out;
    std::string item;
    std::stringstream ss(text);
    while (std::getline(ss, item, ',')) {
        const auto b = item.find_first_not_of(" \t[");
        const auto e = item.find_last_not_of(" \t]");
        item = b == std::string::npos ? std::string() : item.substr(b, e - b + 1);
        out.push_back(parseInt(key, item, lo, hi));
    }
    if (out.empty() || out.size() > maxItems)
        throw ConfigError(quoteKey(key) + " must list 1 to 16 layer widths, e.g. 128,128 (got '" + text +
                          "')");
    return out;
}

bool parseBool(const std::string& key, const std::string& text) {
    if (text == "true" || text == "on" || text == "1" || text == "yes") return true;
    if (text == "false" || text == "off" || text == "0" || text == "no") return false;
    throw ConfigError(quoteKey(key) + " must be true or false (got '" + text + "')");
}

std::string checkLossScale(const std::string& text) {
    if (text == "auto" || text == "dynamic" || text == "off") return text;
    if (text.rfind("static:", 0) == 0) {
        // Below 1e-30 the reciprocal the gradients are unscaled by is no longer a finite float
        // (and 1e-46 is 0): every step would be skipped.
        parseFloat("loss_scale", text.substr(7), 1e-30, false, 1e38, false);
        return text;
    }
    throw ConfigError("`loss_scale` must be auto, dynamic, static:N (1e-30 <= N <= 1e38) or off (got '" +
                      text + "')");
}

const std::vector<KeyDef>& keyDefs() {
    static const std::vector<KeyDef> defs = [] {
        std::vector<KeyDef> d;
        auto str = [&](const char* name, const char* help, std::string RunSpec::*m, bool allowEmpty) {
            d.push_back({{name, "string", help, {}},
                         [m](const RunSpec& s) { return s.*m; },
                         [m, name, allowEmpty](RunSpec& s, const std::string& v) {
                             if (!allowEmpty && v.empty())
                                 throw ConfigError(quoteKey(name) + " must not be empty");
                             if (v.size() > 4096)
                                 throw ConfigError(quoteKey(name) + " is too long (max 4096 characters)");
                             s.*m = v;
                         }});
        };
        auto choice = [&](const char* name, const char* help, std::string RunSpec::*m,
                          std::vector<std::string> cs) {
            d.push_back(
                {{name, "choice", help, cs},
                 [m](const RunSpec& s) { return s.*m; },
                 [m, name, cs](RunSpec& s, const std::string& v) { s.*m = parseChoice(name, v, cs); }});
        };
        auto integer = [&](const char* name, const char* help, int64_t RunSpec::*m, int64_t lo, int64_t hi) {
            d.push_back(
                {{name, "int", help, {}},
                 [m](const RunSpec& s) { return std::to_string(s.*m); },
                 [m, name, lo, hi](RunSpec& s, const std::string& v) { s.*m = parseInt(name, v, lo, hi); }});
        };
        auto boolean = [&](const char* name, const char* help, bool RunSpec::*m) {
            d.push_back({{name, "bool", std::string(help) + " (true or false)", {}},
                         [m](const RunSpec& s) { return std::string(s.*m ? "true" : "false"); },
                         [m, name](RunSpec& s, const std::string& v) { s.*m = parseBool(name, v); }});
        };
        auto real = [&](const char* name, const char* help, double RunSpec::*m, double lo, bool loOpen,
                        double hi, bool hiOpen) {
            d.push_back({{name, "float", help, {}},
                         [m](const RunSpec& s) { return fmtDouble(s.*m); },
                         [=](RunSpec& s, const std::string& v) {
                             s.*m = parseFloat(name, v, lo, loOpen, hi, hiOpen);
                         }});
        };
        const double inf = HUGE_VAL;
        str("name", "run name (free text; empty = generated)", &RunSpec::name, true);
        str("experiment", "experiment the run belongs to (non-empty)", &RunSpec::experiment, false);
        choice("model", "model from the zoo: mlp, cnn, or embed (hashed feature embeddings + mlp)",
               &RunSpec::model, {"mlp", "cnn", "embed"});
        d.push_back(
            {{"hidden", "int-list", "mlp hidden layer widths, 1 to 16 values of 1..65536, e.g. 128,128", {}},
             [](const RunSpec& s) {
                 std::string out;
                 for (auto w : s.hidden) out += (out.empty() ? "" : ",") + std::to_string(w);
                 return out;
             },
             [](RunSpec& s, const std::string& v) { s.hidden = parseIntList("hidden", v); }});
        d.push_back(
            {{"data",
              "string",
              "data set: digits, synthetic:spirals, csv:PATH, idx:DIR, images:DIR (a folder per class) "
              "or dataset:NAME[:V] (a versioned data set, lathectl data)",
              {}},
             [](const RunSpec& s) { return s.data; },
             [](RunSpec& s, const std::string& v) { s.data = checkData(v); }});
        integer("embedding_rows", "embed: rows of the hashed (feature, value bin) table, 16..16777216",
                &RunSpec::embeddingRows, 16, 16777216);
        str("label_column", "csv data: name of the label column", &RunSpec::labelColumn, false);
        real("val_split", "share of samples held out for validation, > 0 and < 1", &RunSpec::valSplit, 0,
             true, 1, true);
        integer("epochs", "passes over the training data, 1..100000", &RunSpec::epochs, 1, 100000);
        integer("batch", "samples per step, 1..1000000", &RunSpec::batch, 1, 1000000);
        real("lr", "peak learning rate, > 0 and <= 10", &RunSpec::lr, 0, true, 10, false);
        choice("optimizer", "sgd (with momentum), adam or adamw", &RunSpec::optimizer,
               {"sgd", "adam", "adamw"});
        real("momentum", "sgd momentum, >= 0 and < 1", &RunSpec::momentum, 0, false, 1, true);
        real("weight_decay", "L2 (sgd, adam) or decoupled (adamw) weight decay, >= 0 and < 1",
             &RunSpec::weightDecay, 0, false, 1, true);
        choice("schedule", "learning-rate schedule: constant, step or cosine", &RunSpec::schedule,
               {"constant", "step", "cosine"});
        integer("warmup_steps", "linear warm-up steps from 0 to lr, 0..10000000", &RunSpec::warmupSteps, 0,
                10000000);
        integer("step_epochs", "step schedule: multiply lr by gamma every N epochs, 1..100000",
                &RunSpec::stepEpochs, 1, 100000);
        real("gamma", "step schedule decay factor, > 0 and <= 1", &RunSpec::gamma, 0, true, 1, false);
        real("min_lr", "cosine schedule floor, >= 0 and <= lr", &RunSpec::minLr, 0, false, inf, false);
        real("clip_grad_norm", "clip the global gradient norm to this value, >= 0 (0 = off)",
             &RunSpec::clipGradNorm, 0, false, inf, false);
        integer("seed", "random seed for initialisation, split and shuffling, 0..2^62", &RunSpec::seed, 0,
                int64_t{1} << 62);
        integer("log_every", "record train/loss every N steps, 1..1000000", &RunSpec::logEvery, 1, 1000000);
        integer("checkpoint_every", "write a checkpoint every N epochs, 0..100000 (0 = only at the end)",
                &RunSpec::checkpointEvery, 0, 100000);
        integer("threads", "intra-op CPU threads, 0..1024 (0 = library default)", &RunSpec::threads, 0, 1024);
        choice("device", "where to train: auto (cuda when available), cpu or cuda", &RunSpec::device,
               {"auto", "cpu", "cuda"});
        choice("precision", "fp32, or autocast to bf16 / fp16 with FP32 master weights (fp16 needs a GPU)",
               &RunSpec::precision, {"fp32", "bf16", "fp16"});
        d.push_back({{"loss_scale",
                      "string",
                      "auto (dynamic for fp16, else off), dynamic, static:N (1e-30 <= N <= 1e38) or off",
                      {}},
                     [](const RunSpec& s) { return s.lossScale; },
                     [](RunSpec& s, const std::string& v) { s.lossScale = checkLossScale(v); }});
        real("loss_scale_init", "initial dynamic loss scale, 1e-30..1e38 (default 65536 = 2^16)",
             &RunSpec::lossScaleInit, 1e-30, false, 1e38, false);
        real("loss_scale_growth", "factor applied after growth_interval clean steps, > 1",
             &RunSpec::lossScaleGrowth, 1, true, 1e6, false);
        real("loss_scale_backoff", "factor applied on a step with inf/NaN gradients, > 0 and < 1",
             &RunSpec::lossScaleBackoff, 0, true, 1, true);
        integer("loss_scale_growth_interval", "clean steps in a row before the scale grows, 1..100000000",
                &RunSpec::lossScaleGrowthInterval, 1, 100000000);
        d.push_back({{"inject_nonfinite",
                      "int-list",
                      "fault injection: steps (1-based) whose gradient gets an inf, e.g. 5,9 (empty = none)",
                      {}},
                     [](const RunSpec& s) {
                         std::string out;
                         for (auto w : s.injectNonfinite) out += (out.empty() ? "" : ",") + std::to_string(w);
                         return out;
                     },
                     [](RunSpec& s, const std::string& v) {
                         s.injectNonfinite.clear();
                         if (v.find_first_not_of(" \t[]") == std::string::npos) return;  // empty list
                         for (const auto& step :
                              parseIntList("inject_nonfinite", v, 1, int64_t{1} << 62, 1 << 20))
                             s.injectNonfinite.push_back(step);
                     }});
        boolean("activation_checkpointing", "recompute hidden blocks' activations in backward to save memory",
                &RunSpec::activationCheckpointing);
        auto intList = [&](const char* name, const char* help, std::vector<int64_t> RunSpec::*m) {
            d.push_back({{name, "int-list", help, {}},
                         [m](const RunSpec& s) {
                             std::string out;
                             for (auto w : s.*m) out += (out.empty() ? "" : ",") + std::to_string(w);
                             return out;
                         },
                         [m, name](RunSpec& s, const std::string& v) { s.*m = parseIntList(name, v); }});
        };
        intList("channels", "cnn: output channels of each conv stage, 1 to 16 values of 1..65536, e.g. 16,32",
                &RunSpec::channels);
        intList("head",
                "cnn: widths of the linear layers after the convs, 1 to 16 values of 1..65536, e.g. 64",
                &RunSpec::head);
        str("init_from",
            "start from the weights of this Lathe model artifact (.pt) of the same network (empty = random)",
            &RunSpec::initFrom, true);
        boolean("qat",
                "quantization-aware training: Linear and Conv2d see int8-rounded weights (per channel) and "
                "inputs (per tensor), gradients pass straight through",
                &RunSpec::qat);
        str("teacher", "distillation: the teacher's TorchScript file (empty = no distillation)",
            &RunSpec::teacher, true);
        real("distill_temperature", "distillation: softmax temperature of the soft targets, > 0 and <= 100",
             &RunSpec::distillTemperature, 0, true, 100, false);
        real("distill_alpha", "distillation: weight of the soft-target loss, 0..1 (the rest: hard labels)",
             &RunSpec::distillAlpha, 0, false, 1, false);
        choice("distill_hints",
               "distillation: FitNets hints from the teacher's block outputs through a learned regressor: "
               "none, last (the last hidden block) or all (blocks paired from the end)",
               &RunSpec::distillHints, {"none", "last", "all"});
        real("hint_weight", "distillation: weight of the hint loss, >= 0 and <= 1e6", &RunSpec::hintWeight, 0,
             false, 1e6, false);
        real("attention_transfer",
             "distillation (cnn): beta of the attention-transfer loss on conv blocks, >= 0 and <= 1e9 (0 = "
             "off; "
             "1 is usual)",
             &RunSpec::attentionTransfer, 0, false, 1e9, false);
        boolean("profile", "record op-level spans and step phases on the profile_* schedule",
                &RunSpec::profile);
        integer("profile_wait", "profiler: steps skipped at the start of each cycle, 0..100000000",
                &RunSpec::profileWait, 0, 100000000);
        integer("profile_warmup", "profiler: steps attached but not recorded, 0..100000000",
                &RunSpec::profileWarmup, 0, 100000000);
        integer("profile_active", "profiler: steps recorded per cycle, 1..100000000", &RunSpec::profileActive,
                1, 100000000);
        integer("nproc", "data-parallel worker processes on this machine, 1..256 (batch is per process)",
                &RunSpec::nproc, 1, 256);
        real("bucket_mb", "gradient all-reduce bucket size in MB, > 0 and <= 1024 (the first bucket is 1 MB)",
             &RunSpec::bucketMb, 0, true, 1024, false);
        choice("strategy",
               "gradient exchange: ring (all-reduce), hierarchical (within host, then among hosts) or ps "
               "(parameter-server style)",
               &RunSpec::strategy, {"ring", "hierarchical", "ps"});
        choice("backend",
               "collective engine: auto (NCCL when training on CUDA with a GPU per rank and a LibTorch "
               "with NCCL, else Gloo), gloo (CPU; CUDA gradients are staged through host memory) or nccl",
               &RunSpec::backend, {"auto", "gloo", "nccl"});
        integer("ranks_per_host", "hierarchical: ranks per host, 0..4096 (0 = LOCAL_WORLD_SIZE)",
                &RunSpec::ranksPerHost, 0, 4096);
        integer("ps_ranks", "ps: how many ranks (0..N-1) aggregate gradients, 1..4096", &RunSpec::psRanks, 1,
                4096);
        choice("compress", "gradient compression on the wire: none, fp16, bf16, int8 or int4",
               &RunSpec::compress, {"none", "fp16", "bf16", "int8", "int4"});
        choice("error_feedback",
               "keep each step's compression error and add it to the next: auto (on for int8/int4), "
               "on or off",
               &RunSpec::errorFeedback, {"auto", "on", "off"});
        integer("compress_chunk", "elements per int8/int4 scale, 8..1048576, a multiple of 8",
                &RunSpec::compressChunk, 8, 1 << 20);
        integer("tensor_parallel",
                "tensor parallel: ranks each pair of Linear layers is split over (column, then row), 1..256 "
                "(nproc must be a multiple of stages x this; nproc = 1 means exactly that many)",
                &RunSpec::tensorParallel, 1, 256);
        integer("pipeline_stages",
                "pipeline parallel: processes the model's layers are split over, 1..256 (nproc must be a "
                "multiple: replicas x stages; nproc = 1 means one per stage)",
                &RunSpec::pipelineStages, 1, 256);
        integer("micro_batches",
                "pipeline parallel: micro-batches each batch is split into, 1..4096 (more: a smaller bubble)",
                &RunSpec::microBatches, 1, 4096);
        choice("pipeline_schedule",
               "pipeline parallel: gpipe (all forwards, then all backwards) or 1f1b (one forward, one "
               "backward: at most one micro-batch per stage in flight)",
               &RunSpec::pipelineSchedule, {"gpipe", "1f1b"});
        choice("balance",
               "pipeline parallel: balance the stages by parameter count (params) or by each layer's "
               "measured forward and backward time (time)",
               &RunSpec::balance, {"params", "time"});
        boolean("stochastic_rounding", "int8/int4: round stochastically (unbiased) instead of to nearest",
                &RunSpec::stochasticRounding);
        integer("profile_repeat", "profiler: cycles, 0..100000000 (0 = until the run ends)",
                &RunSpec::profileRepeat, 0, 100000000);
        integer("loader_workers",
                "data loader threads preparing batches, 0..256 (0 = in the training thread); batches are "
                "the same whatever the number",
                &RunSpec::loaderWorkers, 0, 256);
        integer("prefetch", "batches the loader prepares ahead of the step, 1..1024", &RunSpec::prefetch, 1,
                1024);
        integer("cache_memory_mb",
                "images: in-memory cache of decoded, resized samples in MB, 0..1048576 (0 = off)",
                &RunSpec::cacheMemoryMb, 0, 1 << 20);
        real("cache_disk_gb",
             "images: disk cache of decoded, resized samples in GB under the workspace's cache folder, "
             "0..100000 "
             "(0 = off)",
             &RunSpec::cacheDiskGb, 0, false, 100000, false);
        d.push_back(
            {{"cache_redis",
              "string",
              "images: Redis cache shared by every worker and host, redis://HOST:PORT[/DB] (empty = off)",
              {}},
             [](const RunSpec& s) { return s.cacheRedis; },
             [](RunSpec& s, const std::string& v) {
                 if (!v.empty()) data::parseRedisUrl(v);  // ConfigError saying what is wrong
                 s.cacheRedis = v;
             }});
        integer("cache_redis_ttl", "images: seconds a Redis cache entry lives, 1..31536000",
                &RunSpec::cacheRedisTtl, 1, 31536000);
        integer("resize", "images: resize so the shorter side is N pixels, 0..8192 (0 = as stored)",
                &RunSpec::resize, 0, 8192);
        integer("crop", "images: square crop of N pixels, 0..8192 (0 = none: every image must have one size)",
                &RunSpec::crop, 0, 8192);
        boolean("random_crop", "images: training crops at random places (validation: the centre)",
                &RunSpec::randomCrop);
        boolean("hflip", "images: flip training samples left-right with probability 1/2", &RunSpec::hflip);
        d.push_back({{"normalize",
                      "string",
                      "images: none (pixels / 255), imagenet, or MEAN/STD per channel, e.g. "
                      "0.5,0.5,0.5/0.25,0.25,0.25",
                      {}},
                     [](const RunSpec& s) { return s.normalize; },
                     [](RunSpec& s, const std::string& v) {
                         float m[3], sd[3];
                         data::parseNormalize(v, m, sd);
                         s.normalize = v;
                     }});
        choice("color", "images: rgb or gray", &RunSpec::color, {"rgb", "gray"});
        choice("bad_samples",
               "images: an unreadable or corrupt file stops the run (error) or is skipped and counted (skip)",
               &RunSpec::badSamples, {"error", "skip"});
        str("ppo_policy",
            "tuning: a PPO agent's policy file that changes lr and batch during training (set by lathectl "
            "tune "
            "--algo ppo; empty = none)",
            &RunSpec::ppoPolicy, true);
        integer("ppo_interval", "tuning: epochs between the PPO agent's decisions, 1..100000",
                &RunSpec::ppoInterval, 1, 100000);
        return d;
    }();
    return defs;
}

const KeyDef* findKey(const std::string& key) {
    for (const auto& d : keyDefs())
        if (d.info.name == key) return &d;
    return nullptr;
}

std::string knownKeys() {
    std::string out;
    for (const auto& d : keyDefs()) out += (out.empty() ? "" : ", ") + d.info.name;
    return out;
}

// A TOML value as the text form the setters read; type errors name the expected kind.
std::string tomlValueText(const KeyDef& def, const toml::node& node) {
    const auto& kind = def.info.kind;
    const std::string k = quoteKey(def.info.name);
    if (kind == "int") {
        if (auto v = node.value_exact<int64_t>()) return std::to_string(*v);
        throw ConfigError(k + " must be an integer (" + def.info.help + ")");
    }
    if (kind == "float") {
        if (auto v = node.value_exact<double>()) return fmtDouble(*v);
        if (auto v = node.value_exact<int64_t>()) return std::to_string(*v);
        throw ConfigError(k + " must be a number (" + def.info.help + ")");
    }
    if (kind == "bool") {
        if (auto v = node.value_exact<bool>()) return *v ? "true" : "false";
        throw ConfigError(k + " must be true or false");
    }
    if (kind == "int-list") {
        if (const auto* arr = node.as_array()) {
            std::string out;
            for (const auto& el : *arr) {
                auto v = el.value_exact<int64_t>();
                if (!v) throw ConfigError(k + " must be an array of integers, e.g. [128, 128]");
                out += (out.empty() ? "" : ",") + std::to_string(*v);
            }
            return out;
        }
        throw ConfigError(k + " must be an array of integers, e.g. [128, 128]");
    }
    if (auto v = node.value_exact<std::string>()) return *v;
    throw ConfigError(k + " must be a string (" + def.info.help + ")");
}

}  // namespace

const std::vector<SpecKey>& specKeys() {
    static const std::vector<SpecKey> keys = [] {
        std::vector<SpecKey> out;
        for (const auto& d : keyDefs()) out.push_back(d.info);
        return out;
    }();
    return keys;
}

void setSpecValue(RunSpec& spec, const std::string& key, const std::string& value) {
    const KeyDef* def = findKey(key);
    if (!def) throw ConfigError("unknown key " + quoteKey(key) + " (known keys: " + knownKeys() + ")");
    def->set(spec, value);
}

std::string checkSpecValue(const std::string& key, const std::string& value) {
    RunSpec scratch;
    try {
        setSpecValue(scratch, key, value);
    } catch (const ConfigError& ex) {
        return ex.what();
    }
    return {};
}

std::string specValue(const RunSpec& spec, const std::string& key) {
    const KeyDef* def = findKey(key);
    if (!def) throw ConfigError("unknown key " + quoteKey(key));
    return def->get(spec);
}

std::map<std::string, std::string> specParams(const RunSpec& spec) {
    std::map<std::string, std::string> out;
    for (const auto& d : keyDefs()) out[d.info.name] = d.get(spec);
    return out;
}

std::vector<std::string> validate(const RunSpec& spec) {
    std::vector<std::string> problems;
    // Every field must pass its own setter (catches values written straight into the struct).
    for (const auto& d : keyDefs()) {
        RunSpec scratch;
        try {
            d.set(scratch, d.get(spec));
        } catch (const ConfigError& ex) {
            problems.push_back(ex.what());
        }
    }
    if (spec.precision == "fp16" && spec.device == "cpu")
        problems.push_back("`precision` fp16 needs a CUDA GPU (device = cpu); use bf16 on the CPU");
    // Only the loss scaler checks gradients and skips a step: without it the injected inf would
    // reach the weights and the run would fail later, blaming the learning rate.
    if (!spec.injectNonfinite.empty() && lossScaleMode(spec).kind == LossScaleMode::Kind::Off)
        problems.push_back(
            "`inject_nonfinite` needs loss scaling, which skips the step it spoils: set `loss_scale` to "
            "dynamic or static:N (with precision " +
            spec.precision + ", auto means off)");
    if (spec.nproc > 1 && spec.strategy == "ps" && spec.psRanks >= spec.nproc)
        problems.push_back("`ps_ranks` must be below `nproc` (" + std::to_string(spec.psRanks) +
                           " >= " + std::to_string(spec.nproc) + ")");
    if (spec.nproc > 1 && spec.strategy == "hierarchical" && spec.ranksPerHost > 0 &&
        spec.nproc % spec.ranksPerHost != 0)
        problems.push_back("`ranks_per_host` must divide `nproc` (" + std::to_string(spec.nproc) + " % " +
                           std::to_string(spec.ranksPerHost) + " != 0)");
    const int64_t split = spec.pipelineStages * spec.tensorParallel;
    if (split > 1) {
        const std::string what = spec.pipelineStages > 1 && spec.tensorParallel > 1
                                     ? "pipeline_stages x tensor_parallel"
                                 : spec.pipelineStages > 1 ? "pipeline_stages"
                                                           : "tensor_parallel";
        if (spec.nproc > 1 && spec.nproc % split != 0)
            problems.push_back("`nproc` must be a multiple of `" + what + "` (" + std::to_string(spec.nproc) +
                               " % " + std::to_string(split) +
                               " != 0): nproc = data-parallel replicas x stages x " +
                               "tensor-parallel ranks");
        if (spec.strategy == "hierarchical")
            problems.push_back("`strategy` hierarchical is not combined with `" + what +
                               "` yet; use ring or ps");
        if (!spec.teacher.empty())
            problems.push_back("`teacher` (distillation) needs the whole network in one process: set " +
                               what + " to 1");
        if (!spec.ppoPolicy.empty())
            problems.push_back(
                "`ppo_policy` (the tuning agent) changes the batch size of a single process; "
                "set " +
                what + " to 1");
        if (spec.tensorParallel > 1 && spec.qat)
            problems.push_back(
                "`qat` layers are not split by `tensor_parallel` yet; set tensor_parallel = 1");
    }
    if (spec.compressChunk % 8 != 0)
        problems.push_back("`compress_chunk` must be a multiple of 8 (got " +
                           std::to_string(spec.compressChunk) + ")");
    if (!spec.ppoPolicy.empty() && spec.nproc > 1)
        problems.push_back(
            "`ppo_policy` (the tuning agent) changes the batch size of a single process; set nproc = 1");
    if (spec.teacher.empty() && (spec.distillHints != "none" || spec.attentionTransfer > 0))
        problems.push_back("`distill_hints` and `attention_transfer` need a `teacher`");
    if (!spec.teacher.empty() && spec.activationCheckpointing &&
        (spec.distillHints != "none" || spec.attentionTransfer > 0))
        problems.push_back(
            "`distill_hints` and `attention_transfer` read the student's block outputs, which activation "
            "checkpointing does not keep: set activation_checkpointing = false");
    if (spec.attentionTransfer > 0 && spec.model != "cnn")
        problems.push_back(
            "`attention_transfer` compares convolutional feature maps: it needs a cnn student (model = \"" +
            spec.model + "\")");
    if (spec.model == "embed" && spec.qat)
        problems.push_back("`qat` quantizes Linear and Conv2d layers of the mlp and cnn models, not embed");
    if (spec.randomCrop && spec.crop == 0) problems.push_back("`random_crop` needs a `crop` size");
    if (spec.resize > 0 && spec.crop > spec.resize)
        problems.push_back("`crop` must be <= `resize` (" + std::to_string(spec.crop) + " > " +
                           std::to_string(spec.resize) + ")");
    if (spec.minLr > spec.lr)
        problems.push_back("`min_lr` must be <= `lr` (" + fmtDouble(spec.minLr) + " > " + fmtDouble(spec.lr) +
                           ")");
    return problems;
}

LossScaleMode lossScaleMode(const RunSpec& spec) {
    LossScaleMode m;
    const std::string& v = spec.lossScale;
    if (v == "dynamic" || (v == "auto" && spec.precision == "fp16"))
        m.kind = LossScaleMode::Kind::Dynamic;
    else if (v.rfind("static:", 0) == 0) {
        m.kind = LossScaleMode::Kind::Static;
        m.staticScale = std::strtod(v.c_str() + 7, nullptr);
    }
    return m;
}

RunSpec withParallelDefaults(RunSpec spec) {
    if (spec.nproc == 1) spec.nproc = spec.pipelineStages * spec.tensorParallel;
    return spec;
}

void validateOrThrow(const RunSpec& spec) {
    const auto problems = validate(spec);
    if (!problems.empty()) throw ConfigError(problems.front());
}

RunSpec parseRunSpec(const std::string& tomlText, const std::string& source, bool crossCheck) {
    toml::table tbl;
    try {
        tbl = toml::parse(tomlText, source);
    } catch (const toml::parse_error& ex) {
        throw ConfigError(source + " line " + std::to_string(ex.source().begin.line) + ": " +
                          std::string(ex.description()));
    }
    RunSpec spec;
    for (const auto& [k, node] : tbl) {
        const std::string key(k.str());
        const auto line = std::to_string(node.source().begin.line);
        const KeyDef* def = findKey(key);
        if (!def)
            throw ConfigError(source + " line " + line + ": unknown key " + quoteKey(key) +
                              " (known keys: " + knownKeys() + ")");
        try {
            def->set(spec, tomlValueText(*def, node));
        } catch (const ConfigError& ex) {
            throw ConfigError(source + " line " + line + ": " + ex.what());
        }
    }
    if (!crossCheck) return spec;
    const auto problems = validate(spec);
    if (!problems.empty()) throw ConfigError(source + ": " + problems.front());
    return spec;
}

RunSpec loadRunSpec(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw ConfigError("cannot read config " + path + ": " + std::strerror(errno));
    std::string text;
    char buf[8192];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
        text.append(buf, n);
        if (text.size() > (1u << 20)) {
            std::fclose(f);
            throw ConfigError("config " + path + " is larger than 1 MiB; is it really a run config?");
        }
    }
    std::fclose(f);
    return parseRunSpec(text, path);
}

std::string toToml(const RunSpec& spec) {
    std::ostringstream out;
    out << "# Lathe run configuration\n";
    for (const auto& d : keyDefs()) {
        const std::string v = d.get(spec);
        out << d.info.name << " = ";
        if (d.info.kind == "int" || d.info.kind == "float" || d.info.kind == "bool") {
            out << v;
            if (d.info.kind == "float" && v.find_first_of(".eEn") == std::string::npos) out << ".0";
        } else if (d.info.kind == "int-list") {
            out << "[" << v << "]";
        } else {
            out << toml::value<std::string>(v);
        }
        out << "\n";
    }
    return out.str();
}

}  // namespace lathe::core
