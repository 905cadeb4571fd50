// Saving and loading training state as LibTorch archives inside checkpoint files
// (checkpoint_file.h frames them).
#include "training/checkpoint_io.h"

#include <sstream>

#include "lathe/core/error.h"
#include "training/checkpoint_file.h"

namespace lathe::core {

CheckpointInfo saveCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, int64_t epoch, int64_t step,
                              const CheckpointExtras& extras, const CheckpointOwner& owner) {
    torch::serialize::OutputArchive archive;
    model.save(archive);
    for (const auto& [name, t] : extras) archive.write("lathe." + name, t.cpu());
    torch::serialize::OutputArchive optimArchive;
    optimizer.save(optimArchive);
    archive.write("optimizer", optimArchive);
    std::ostringstream buf;
    archive.save_to(buf);
    return writeCheckpointFile(path, epoch, step, buf.str(), owner);
}

namespace {

// Verifies the file, opens its archive and hands it to `restore`; LibTorch's complaints (a
// missing key, a shape that does not fit) become one CheckpointError line.
template <class Restore>
CheckpointInfo restoreFrom(const std::string& path, const char* what, Restore&& restore) {
    CheckpointInfo info;
    const std::string payload = readCheckpointPayload(path, info);
    try {
        std::istringstream in(payload);
        torch::serialize::InputArchive archive;
        archive.load_from(in);
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
    return restoreFrom(path, "this model and optimizer", [&](torch::serialize::InputArchive& archive) {
        model.load(archive);
        torch::serialize::InputArchive optimArchive;
        archive.read("optimizer", optimArchive);
        optimizer.load(optimArchive);
        if (!extras) return;
        for (auto it = extras->begin(); it != extras->end();) {
            torch::Tensor t;
            if (archive.try_read("lathe." + it->first, t)) {
                it->second = t;
                ++it;
            } else {
                it = extras->erase(it);
            }
        }
        if (extrasPrefix.empty()) return;
        const std::string wanted = "lathe." + extrasPrefix;
        for (const auto& key : archive.keys()) {
            torch::Tensor t;
            if (key.rfind(wanted, 0) == 0 && archive.try_read(key, t)) (*extras)[key.substr(6)] = t;
        }
    });
}

CheckpointInfo loadModelWeights(const std::string& path, torch::nn::Module& model) {
    return restoreFrom(path, "this model",
                       [&](torch::serialize::InputArchive& archive) { model.load(archive); });
}

}  // namespace lathe::core
