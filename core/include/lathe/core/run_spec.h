#pragma once
// RunSpec: everything that defines a training run. The same keys are accepted from a TOML
// file (`lr = 0.01`), from lathectl flags (`--lr 0.01`, underscores become hyphens) and from
// the GUI's run form. Validation messages name the key and the allowed range.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace lathe::core {

struct RunSpec {
    std::string name;                       // free text; empty = generated
    std::string experiment = "default";     // runs are grouped by experiment
    std::string model = "mlp";              // mlp | cnn | embed
    std::vector<int64_t> hidden{128, 128};  // mlp hidden widths (embed: the first is the embedding width)
    int64_t embeddingRows = 16384;          // embed: rows of the hashed feature table
    std::string data =
        "digits";  // digits | csv:PATH | idx:DIR | images:DIR | dataset:NAME[:V] | synthetic:spirals
    std::string labelColumn = "label";  // csv: name of the label column
    double valSplit = 0.2;              // share held out for validation (when the set has no own split)
    int64_t epochs = 20;
    int64_t batch = 64;
    double lr = 1e-3;
    std::string optimizer = "adam";  // sgd | adam | adamw
    double momentum = 0.9;           // sgd
    double weightDecay = 0.0;
    std::string schedule = "constant";  // constant | step | cosine
    int64_t warmupSteps = 0;            // linear warm-up from 0 to lr
    int64_t stepEpochs = 10;            // step schedule: decay every N epochs
    double gamma = 0.1;                 // step schedule: decay factor
    double minLr = 0.0;                 // cosine schedule floor
    double clipGradNorm = 0.0;          // 0 = off
    int64_t seed = 42;
    int64_t logEvery = 10;        // train/loss every N steps
    int64_t checkpointEvery = 1;  // epochs between checkpoints; 0 = only at the end
    int64_t threads = 0;          // intra-op threads; 0 = library default
    std::string device = "auto";  // auto | cpu | cuda

    // Mixed precision: autocast to bf16/fp16 with FP32 master weights and optimizer state.
    std::string precision = "fp32";  // fp32 | bf16 | fp16
    std::string lossScale = "auto";  // auto (dynamic for fp16, else off) | dynamic | static:N | off
    double lossScaleInit = 65536.0;  // 2^16, as torch.cuda.amp.GradScaler
    double lossScaleGrowth = 2.0;
    double lossScaleBackoff = 0.5;
    int64_t lossScaleGrowthInterval = 2000;
    std::vector<int64_t> injectNonfinite;  // steps (1-based) whose gradient gets an inf (fault injection)

    bool activationCheckpointing = false;  // recompute hidden blocks' activations in backward

    // The cnn's shape (model = "cnn"): conv stages, then linear layers.
    std::vector<int64_t> channels{16, 32};  // output channels of each conv stage
    std::vector<int64_t> head{64};          // widths of the linear layers after the convs

    // Starting point and compression-aware training (core/src/compression/README.md).
    std::string initFrom;  // a Lathe model artifact (.pt) whose weights the network starts from
    bool qat = false;      // quantization-aware: fake int8 weights and inputs in Linear/Conv2d
    std::string teacher;   // distillation: the teacher (any TorchScript classifier); empty = none
    double distillTemperature = 4.0;
    double distillAlpha = 0.7;          // weight of the soft-target loss; 1 - alpha: hard labels
    std::string distillHints = "none";  // FitNets hints: none | last | all (block outputs, from the end)
    double hintWeight = 1.0;
    double attentionTransfer = 0.0;  // beta of the attention-transfer loss (cnn); 0 = off

    // Profiler (schedule like torch.profiler.schedule).
    bool profile = false;
    int64_t profileWait = 5;
    int64_t profileWarmup = 1;
    int64_t profileActive = 5;
    int64_t profileRepeat = 1;  // 0 = until the run ends

    // Data-parallel training.
    int64_t nproc = 1;                   // local worker processes (ranks); batch is per rank
    double bucketMb = 25.0;              // gradient bucket size (the first bucket is 1 MB)
    std::string strategy = "ring";       // ring | hierarchical | ps
    std::string backend = "auto";        // auto (nccl when every rank has its own GPU) | gloo | nccl
    int64_t ranksPerHost = 0;            // hierarchical: ranks per host (0 = from LOCAL_WORLD_SIZE)
    int64_t psRanks = 1;                 // ps: ranks 0..ps_ranks-1 aggregate gradients
    std::string compress = "none";       // none | fp16 | bf16 | int8 | int4 (gradients on the wire)
    std::string errorFeedback = "auto";  // auto (on for int8/int4) | on | off
    int64_t compressChunk = 2048;        // elements per int8/int4 scale
    bool stochasticRounding = false;

    // Model parallelism (core/src/distributed/README.md): nproc = data-parallel replicas x
    // pipeline stages x tensor-parallel ranks.
    int64_t tensorParallel = 1;             // Linear layers split in column/row pairs over this many ranks
    int64_t pipelineStages = 1;             // consecutive layers split over this many processes
    int64_t microBatches = 4;               // a stage's batch is split into this many micro-batches
    std::string pipelineSchedule = "1f1b";  // gpipe | 1f1b
    std::string balance = "params";         // params | time: what the stages are balanced by

    // Data pipeline (core/src/data/README.md): the loader, the sample caches, the image steps.
    int64_t loaderWorkers = 2;         // threads preparing batches (0: in the training thread)
    int64_t prefetch = 4;              // batches prepared ahead of the step
    int64_t cacheMemoryMb = 256;       // level 1: in-memory LRU of prepared samples (0 = off)
    double cacheDiskGb = 0.0;          // level 2: memory-mapped files in the workspace's cache (0 = off)
    std::string cacheRedis;            // level 3: redis://HOST:PORT[/DB] (empty = off)
    int64_t cacheRedisTtl = 86400;     // seconds a Redis entry lives
    int64_t resize = 0;                // images: shorter side in pixels (0 = as stored)
    int64_t crop = 0;                  // images: square crop side (0 = none)
    bool randomCrop = false;           // images: training crops at random places (else the centre)
    bool hflip = false;                // images: training samples flipped left-right half the time
    std::string normalize = "none";    // images: none | imagenet | MEAN/STD
    std::string color = "rgb";         // images: rgb | gray
    std::string badSamples = "error";  // images: error | skip (unreadable files skipped and counted)

    // Hyper-parameter tuning's PPO agent (lathectl tune --algo ppo; tuning/ppo_hook.cpp): a
    // policy file changes the learning rate and batch size every `ppo_interval` epochs.
    std::string ppoPolicy;    // the agent's policy (empty = no agent)
    int64_t ppoInterval = 1;  // epochs between its decisions
};

/// The loss-scaling mode a spec resolves to.
struct LossScaleMode {
    enum class Kind { Off, Dynamic, Static } kind = Kind::Off;
    double staticScale = 1.0;
};
LossScaleMode lossScaleMode(const RunSpec& spec);

/// One configurable key: its TOML/flag name, the kind of value and a help line that states
/// the allowed values. The GUI and the CLI are both generated from this table.
struct SpecKey {
    std::string name;                  // TOML key, e.g. "weight_decay"; flag is "--weight-decay"
    std::string kind;                  // "int", "float", "string", "choice", "int-list", "bool"
    std::string help;                  // includes the allowed range
    std::vector<std::string> choices;  // for kind == "choice"
};
const std::vector<SpecKey>& specKeys();

/// Parses a TOML file. Throws ConfigError "PATH line L: `key` must be ...".
RunSpec loadRunSpec(const std::string& path);
/// Parses TOML text; `source` names it in messages. `crossCheck` false skips validate(): for a
/// recorded run's config, which flags may still amend and which a newer Lathe may check more
/// strictly than the one that recorded it.
RunSpec parseRunSpec(const std::string& tomlText, const std::string& source = "config",
                     bool crossCheck = true);
/// Applies `--key value` / a form field. Throws ConfigError "`key` must be ..." for a bad
/// value or "unknown key `key`".
void setSpecValue(RunSpec& spec, const std::string& key, const std::string& value);
/// Checks one value without applying it (for validate-as-you-type). Empty = valid.
std::string checkSpecValue(const std::string& key, const std::string& value);
/// Cross-field and range checks; empty = valid. Each message names its key.
std::vector<std::string> validate(const RunSpec& spec);
/// nproc = 1 with pipeline stages or tensor parallelism means one process per stage and
/// tensor-parallel rank: returns the spec with nproc set so (recorded runs keep the world they ran
/// with).
RunSpec withParallelDefaults(RunSpec spec);
/// Throws ConfigError with the first message of validate().
void validateOrThrow(const RunSpec& spec);
/// The value of a key as text (the form shows it; params table stores it).
std::string specValue(const RunSpec& spec, const std::string& key);
/// All keys and values, as stored in the params table.
std::map<std::string, std::string> specParams(const RunSpec& spec);
/// TOML text that parseRunSpec reads back into an equal spec.
std::string toToml(const RunSpec& spec);

}  // namespace lathe::core
