// Layout time of model graphs of 500, 5,000 and 20,000 nodes (transformer encoder blocks, every
// scope expanded, and with the workbench's default collapsing), by layoutGraphView (libgvc, dot
// tuned for large graphs) against Graphviz's `dot` program with its defaults on the same graph,
// side by side. Target (issue 16): 5,000 nodes expanded under 3 s.
//   bench_graph_layout [--out DIR] [--quick] [--baseline-limit SECONDS]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "graph_fixture.h"
#include "lathe/core/graph_layout.h"
#include "lathe/core/model_graph.h"

using namespace lathe::core;

namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Graphviz's own `dot` on the same view with its defaults (splines, full crossing minimisation):
// seconds, or -1 when it ran past `limit` (killed) or is not installed.
double dotProgram(const GraphView& view, double limit, const std::string& dir) {
    LayoutOptions o;
    const std::string path = dir + "/bench_graph_layout.gv";
    {
        // The same boxes and clusters; none of the tuning layoutGraphView adds for large graphs.
        std::ofstream out(path);
        out << "digraph g {\n node [shape=box, fixedsize=true, label=\"\"];\n";
        std::vector<std::vector<size_t>> members(view.clusters.size()), children(view.clusters.size());
        std::vector<size_t> top;
        for (size_t i = 0; i < view.nodes.size(); ++i)
            if (view.nodes[i].cluster >= 0)
                members[static_cast<size_t>(view.nodes[i].cluster)].push_back(i);
            else
                top.push_back(i);
        std::vector<size_t> roots;
        for (size_t c = 0; c < view.clusters.size(); ++c)
            if (view.clusters[c].parent >= 0)
                children[static_cast<size_t>(view.clusters[c].parent)].push_back(c);
            else
                roots.push_back(c);
        auto node = [&](size_t i) {
            const auto [w, h] = viewNodeSize(view.nodes[i]);
            out << " n" << i << " [width=" << w / 72 << ", height=" << h / 72 << "];\n";
        };
        auto emit = [&](size_t c, auto&& self) -> void {
            out << " subgraph cluster_" << c << " {\n  label=\"" << view.clusters[c].label << "\";\n";
            for (size_t i : members[c]) node(i);
            for (size_t k : children[c]) self(k, self);
            out << " }\n";
        };
        for (size_t i : top) node(i);
        for (size_t c : roots) emit(c, emit);
        for (const auto& e : view.edges) out << " n" << e.from << " -> n" << e.to << ";\n";
        out << "}\n";
    }
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid == 0) {
        execlp("dot", "dot", "-Tplain", "-o", "/dev/null", path.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (seconds(t0) > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            std::remove(path.c_str());
            return -1;
        }
        usleep(5000);
    }
    std::remove(path.c_str());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -2;
    return seconds(t0);
}

}  // namespace

int main(int argc, char** argv) {
    std::string outDir;
    bool quick = false;
    double baselineLimit = 60;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            outDir = argv[++i];
        else if (a == "--quick")
            quick = true;
        else if (a == "--baseline-limit" && i + 1 < argc)
            baselineLimit = std::atof(argv[++i]);
        else {
            std::fprintf(stderr, "usage: bench_graph_layout [--out DIR] [--quick] [--baseline-limit S]\n");
            return 2;
        }
    }
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = tmp && *tmp ? tmp : "/tmp";
    std::vector<int64_t> sizes{500, 5000, 20000};
    if (quick) baselineLimit = std::min(baselineLimit, 20.0);
    nlohmann::json results = nlohmann::json::array();
    std::printf("%8s  %-9s  %7s  %7s  %10s  %10s  %12s\n", "nodes", "view", "boxes", "edges", "lathe s",
                "dot(1) s", "dot ÷ lathe");
    bool failed = false;
    for (int64_t n : sizes) {
        const ModelGraph g = lathe::bench::encoderStack(n);
        for (const bool collapsedView : {false, true}) {
            const auto collapsed = collapsedView ? defaultCollapsed(g) : std::set<std::string>{};
            const auto t0 = std::chrono::steady_clock::now();
            const GraphView view = buildGraphView(g, collapsed);
            const GraphLayout layout = layoutGraphView(view);
            const double ours = seconds(t0);
            if (layout.nodes.size() != view.nodes.size() || layout.width <= 0) failed = true;
            // The baseline only where it can finish: stock dot takes minutes on the largest.
            const double base = dotProgram(view, baselineLimit, dir);
            char baseText[32], ratio[32];
            if (base == -2) {
                std::snprintf(baseText, sizeof baseText, "missing");
                std::snprintf(ratio, sizeof ratio, "-");
            } else if (base < 0) {
                std::snprintf(baseText, sizeof baseText, "> %.0f", baselineLimit);
                std::snprintf(ratio, sizeof ratio, "> %.1f×", baselineLimit / ours);
            } else {
                std::snprintf(baseText, sizeof baseText, "%.2f", base);
                std::snprintf(ratio, sizeof ratio, "%.1f×", base / ours);
            }
            std::printf("%8zu  %-9s  %7zu  %7zu  %10.2f  %10s  %12s\n", g.nodes.size(),
                        collapsedView ? "collapsed" : "expanded", view.nodes.size(), view.edges.size(), ours,
                        baseText, ratio);
            std::fflush(stdout);
            results.push_back({{"nodes", g.nodes.size()},
                               {"view", collapsedView ? "collapsed" : "expanded"},
                               {"boxes", view.nodes.size()},
                               {"lathe_seconds", ours},
                               {"dot_seconds", base >= 0 ? nlohmann::json(base) : nlohmann::json(nullptr)},
                               {"dot_limit", baselineLimit}});
        }
    }
    if (!outDir.empty()) {
        std::ofstream out(outDir + "/bench_graph_layout.json");
        out << nlohmann::json{{"bench", "graph_layout"}, {"results", results}}.dump(2) << "\n";
    }
    if (failed) {
        std::fprintf(stderr, "bench_graph_layout: a layout came back without every node placed\n");
        return 1;
    }
    return 0;
}
