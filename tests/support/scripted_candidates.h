#pragma once
// Candidate versions of the serving fixture's "digits" model that misbehave on purpose, for the
// tests of automatic rollback (a rollout's controller, an alert rule with action = "rollback",
// locally and on another host). Each is TorchScript written in Python around digits v1's own
// artifact, so it answers as v1 does and keeps v1's signature (its Lathe metadata), and is
// registered with `lathectl models register` as the next version. Needs python3-torch.
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "lathe/core/registry.h"
#include "run_process.h"
#include "serving_fixture.h"

namespace lathe::test {

/// Whether python3 with torch is there to write the candidates.
inline bool pythonTorchAvailable() { return runShell("/usr/bin/python3 -c 'import torch'").exitCode == 0; }

/// Registers, as the next version of digits, v1 with `forward` (Python lines indented 8 spaces:
/// extra work, or a failure) run before v1's answer. Returns the version; throws when the script
/// or the registration fails (with its stderr).
inline int64_t registerScriptedCandidate(const ServingWorkspace& ws, const std::string& name,
                                         const std::string& forward) {
    const auto file = ws.file(name + ".pt");
    const auto script = ws.file(name + ".py");
    const auto v1 = core::Registry(ws.db()).resolve({"digits", 1, {}}).path;
    std::ofstream(script) << "import torch\n"
                             "extra = {'lathe_meta.json': ''}\n"
                             "base = torch.jit.load('"
                          << v1
                          << "', _extra_files=extra)\n"
                             "class M(torch.nn.Module):\n"
                             "    def __init__(self, base):\n"
                             "        super().__init__()\n"
                             "        torch.manual_seed(5)\n"
                             "        self.base = base\n"
                             "        self.big = torch.nn.Parameter(torch.randn(192, 192) / 14)\n"
                             "    def forward(self, x):\n"
                          << forward
                          << "        return self.base(x)\n"
                             "torch.jit.script(M(base)).save('"
                          << file << "', _extra_files=extra)\n";
    auto r = runShell("/usr/bin/python3 " + script);
    if (r.exitCode != 0) throw std::runtime_error("writing the " + name + " candidate failed: " + r.err);
    r = runShell(binPath("lathectl") + " models register digits --file " + file + " --json --db " + ws.db());
    if (r.exitCode != 0) throw std::runtime_error("registering the " + name + " candidate failed: " + r.err);
    return nlohmann::json::parse(r.out)["version"].get<int64_t>();
}

/// Fails one batch in ten (an exception in forward answers 500) when its first input is not 0.
inline int64_t registerFaultyCandidate(const ServingWorkspace& ws) {
    return registerScriptedCandidate(
        ws, "faulty",
        "        if bool(x.reshape(-1)[0] != 0) and float(torch.rand(1)) < 0.1:\n"
        "            raise RuntimeError('injected failure')\n");
}

/// Many 192x192 matrix products per batch, data-dependent so nothing folds them away: several
/// times the baseline's latency. 36 of them: with 12, on a loaded 2-core CI machine, the
/// candidate's P99 came out at 1.4x the baseline's (7.1 vs 5.1 ms, HTTP and queueing being most
/// of both), under the 1.5x a rollout judges by, and the test saw a promotion.
inline int64_t registerSlowCandidate(const ServingWorkspace& ws) {
    return registerScriptedCandidate(ws, "slow",
                                     "        z = self.big * x.sum()\n"
                                     "        for _ in range(36):\n"
                                     "            z = torch.tanh(z @ self.big)\n"
                                     "        x = x + z.mean() * 0.0\n");
}

}  // namespace lathe::test
