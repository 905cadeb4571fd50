#pragma once
// Where a run's ranks run, as the run form's Target section chooses it: this machine (no hosts),
// or hosts of the workspace's inventory with a number of slots each, one rank per slot, in rank
// order (`lathectl train --hosts NAME:SLOTS[,...] [--master-addr A] [--stage]`). Plain data: the
// training session turns it into a remote launch.
#include <string>
#include <vector>

namespace lathe::widgets {

struct HostSlots {
    std::string name;  // a host of the workspace's inventory
    int slots = 0;     // ranks to start there
};

struct RunTarget {
    std::vector<HostSlots> hosts;  // empty: this machine; else rank order, every entry slots > 0
    std::string masterAddr;        // empty: the address this machine reaches the first host at
    bool stage = false;            // upload this lathectl to hosts that lack it

    bool isLocal() const { return hosts.empty(); }
    /// The ranks of the run: the sum of the slots.
    int totalSlots() const {
        int total = 0;
        for (const auto& h : hosts) total += h.slots;
        return total;
    }
    /// "gpu-a:2,gpu-b:1", as `lathectl train --hosts` takes it and the run's log records it.
    std::string placement() const {
        std::string out;
        for (const auto& h : hosts) out += (out.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
        return out;
    }
};

}  // namespace lathe::widgets
