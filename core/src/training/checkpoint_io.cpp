// Saving and loading training state as LibTorch archives inside checkpoint files
// (checkpoint_file.h frames them).
#include "training/checkpoint_io.h"

#include <sstream>

#include <filesystem>

#include "distributed/pipeline.h"
#include "distributed/tensor_parallel.h"
#include "lathe/core/error.h"
#include "training/checkpoint_file.h"

namespace lathe::core {

std::string checkpointPayload(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const CheckpointExtras& extras) {
    torch::serialize::OutputArchive archive;
    model.save(archive);
    for (const auto& [name, t] : extras) archive.write("lathe." + name, t.cpu());
    torch::serialize::OutputArchive optimArchive;
    optimizer.save(optimArchive);
    archive.write("optimizer", optimArchive);
    std::ostringstream buf;
    archive.save_to(buf);
    return buf.str();
}

CheckpointInfo saveCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, int64_t epoch, int64_t step,
                              const CheckpointExtras& extras, const CheckpointOwner& owner) {
    return writeCheckpointFile(path, epoch, step, checkpointPayload(model, optimizer, extras), owner);
}

namespace {

// Where `model` lives: its tensors' device, the CPU for a model with none.
torch::Device deviceOf(const torch::nn::Module& model) {
    for (const auto& p : model.parameters()) return p.device();
    for (const auto& b : model.buffers()) return b.device();
    return torch::kCPU;
}

// Verifies the file, opens its archive with every tensor on `device` and hands it to `restore`;
// LibTorch's complaints (a missing key, a shape that does not fit) become one CheckpointError line.
// The device matters: reading a parameter adopts the stored tensor, so a checkpoint written on a
// GPU would otherwise put a CPU model's weights on the GPU (and fail where there is none).
template <class Restore>
CheckpointInfo restoreFrom(const std::string& path, const char* what, torch::Device device,
                           Restore&& restore) {
    CheckpointInfo info;
    const std::string payload = readCheckpointPayload(path, info);
    try {
        std::istringstream in(payload);
        torch::serialize::InputArchive archive;
        archive.load_from(in, device);
        restore(archive);
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw CheckpointError("checkpoint " + path + " does not fit " + what + ": " +
                              msg.substr(0, msg.find('\n')));
    }
    return info;
}

}  // namespace

CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, CheckpointExtras* extras,
                              const std::string& extrasPrefix) {
    return restoreFrom(path, "this model and optimizer", deviceOf(model),
                       [&](torch::serialize::InputArchive& archive) {
                           model.load(archive);
                           torch::serialize::InputArchive optimArchive;
                           archive.read("optimizer", optimArchive);
                           optimizer.load(optimArchive);
                           if (!extras) return;
                           for (auto it = extras->begin(); it != extras->end();) {
                               torch::Tensor t;
                               if (archive.try_read("lathe." + it->first, t)) {
                                   it->second = t.cpu();  // as written
                                   ++it;
                               } else {
                                   it = extras->erase(it);
                               }
                           }
                           if (extrasPrefix.empty()) return;
                           const std::string wanted = "lathe." + extrasPrefix;
                           for (const auto& key : archive.keys()) {
                               torch::Tensor t;
                               if (key.rfind(wanted, 0) == 0 && archive.try_read(key, t))
                                   (*extras)[key.substr(6)] = t.cpu();
                           }
                       });
}

CheckpointInfo loadModelWeights(const std::string& path, torch::nn::Module& model) {
    torch::Tensor bounds, plan;
    const auto device = deviceOf(model);
    const auto info = restoreFrom(path, "this model", device, [&](torch::serialize::InputArchive& archive) {
        if (!archive.try_read("lathe.pipe.bounds", bounds)) {
            model.load(archive);
            return;
        }
        archive.try_read("lathe.tp.plan", plan);
    });
    if (!bounds.defined()) return info;
    // A model-parallel run's files hold their layers under the whole network's names ("3.weight"),
    // a tensor-parallel shard its slice of the split ones: each stage loads into a view of its
    // layers of `model`, or its shards are concatenated into them.
    auto whole = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model.shared_from_this());
    if (!whole)
        throw CheckpointError(
            "checkpoint " + path +
            " holds pipeline stages or tensor-parallel shards, which only a sequential network takes");
    torch::nn::Sequential seq(whole);
    const auto stages = bounds.numel() - 1;
    if (stages < 1 || bounds[stages].item<int64_t>() != static_cast<int64_t>(seq->size()))
        throw CheckpointError("checkpoint " + path + " was cut into stages of another network (" +
                              std::to_string(bounds[std::max<int64_t>(stages, 0)].item<int64_t>()) +
                              " layers, this one " + std::to_string(seq->size()) + ")");
    std::vector<TpSplit> split;
    if (plan.defined())
        for (int64_t i = 0; i < plan.numel(); ++i)
            split.push_back(static_cast<TpSplit>(plan[i].item<int64_t>()));
    auto checkStep = [&](const std::string& file, const CheckpointInfo& got) {
        if (got.step != info.step)
            throw CheckpointError("checkpoint " + file + " is of step " + std::to_string(got.step) + ", " +
                                  path + " of step " + std::to_string(info.step) +
                                  ": they were not written together");
    };
    for (int64_t k = 0; k < stages; ++k) {
        const auto begin = bounds[k].item<int64_t>(), end = bounds[k + 1].item<int64_t>();
        if (split.empty()) {
            auto stage = stageModel(seq, begin, end);
            const std::string file = shardCheckpointPath(path, static_cast<int>(k));
            checkStep(file,
                      restoreFrom(file, "this model's pipeline stage", device,
                                  [&](torch::serialize::InputArchive& archive) { stage->load(archive); }));
            continue;
        }
        // Shards until a file is missing: as many as the run had.
        std::vector<ShardState> shards;
        for (int t = 0;; ++t) {
            const std::string file = shardCheckpointPath(path, static_cast<int>(k), t);
            if (t > 0 && !std::filesystem::exists(file)) break;
            ShardState state;
            checkStep(file, restoreFrom(file, "a tensor-parallel shard", device,
                                        [&](torch::serialize::InputArchive& archive) {
                                            for (auto i = begin; i < end; ++i) {
                                                torch::serialize::InputArchive layer;
                                                if (!archive.try_read(std::to_string(i), layer)) continue;
                                                for (const char* name : {"weight", "bias"}) {
                                                    torch::Tensor t;
                                                    if (layer.try_read(name, t))
                                                        state[std::to_string(i)][name] = t;
                                                }
                                            }
                                        }));
            shards.push_back(std::move(state));
        }
        mergeTensorParallel(seq, split, begin, end, shards);
    }
    return info;
}

bool readCheckpointExtra(const std::string& path, const std::string& name, torch::Tensor& out) {
    bool found = false;
    restoreFrom(path, "a Lathe checkpoint", torch::kCPU, [&](torch::serialize::InputArchive& archive) {
        found = archive.try_read("lathe." + name, out);
    });
    return found;
}

}  // namespace lathe::core
