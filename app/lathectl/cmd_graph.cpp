// lathectl graph: a model's op graph (model_graph.h) as a per-layer summary, JSON, Graphviz DOT,
// or an SVG/PNG drawing (graph_layout.h).
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>

#include "cli_common.h"
#include "lathe/core/error.h"
#include "lathe/core/graph_layout.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/model_graph.h"
#include "lathe/core/registry.h"
#include "lathe/core/run_spec.h"

namespace fs = std::filesystem;

namespace lathe::cli {
namespace {

struct GraphState {
    CommonOptions common;
    std::string file, model, spec, inputShape, format, output;
    int64_t run = 0;
    int collapseDepth = 0;
    bool summary = false, horizontal = false, inProcess = false;
};

// "1,234,567"
std::string grouped(int64_t v) {
    std::string s = std::to_string(v < 0 ? -v : v), out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return (v < 0 ? "-" : "") + out;
}

// 1.2 K, 3.4 M, 5.6 G FLOPs; "-" for none.
std::string flopsText(double f) {
    if (f <= 0) return "-";
    char b[32];
    if (f >= 1e9)
        std::snprintf(b, sizeof b, "%.2f G", f / 1e9);
    else if (f >= 1e6)
        std::snprintf(b, sizeof b, "%.2f M", f / 1e6);
    else if (f >= 1e3)
        std::snprintf(b, sizeof b, "%.1f K", f / 1e3);
    else
        std::snprintf(b, sizeof b, "%.0f", f);
    return b;
}

std::string bytesText(int64_t b) {
    char buf[32];
    if (b >= (int64_t{1} << 20))
        std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
    else
        std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
    return buf;
}

void printSummary(const core::ModelGraph& g) {
    const auto rows = core::graphLayers(g);
    size_t nameW = 5, opW = 2, shapeW = 12;
    for (const auto& r : rows) {
        nameW = std::max(nameW, r.name.size());
        opW = std::max(opW, r.op.size());
        shapeW = std::max(shapeW, r.outputShape.size());
    }
    nameW = std::min<size_t>(nameW, 48);
    std::printf("%-*s  %-*s  %-*s  %14s  %12s\n", static_cast<int>(nameW), "layer", static_cast<int>(opW),
                "op", static_cast<int>(shapeW), "output shape", "parameters", "FLOPs");
    for (const auto& r : rows)
        std::printf("%-*s  %-*s  %-*s  %14s  %12s\n", static_cast<int>(nameW), r.name.c_str(),
                    static_cast<int>(opW), r.op.c_str(), static_cast<int>(shapeW), r.outputShape.c_str(),
                    grouped(r.parameters).c_str(), flopsText(r.flops).c_str());
    std::string input = "no example input";
    if (!g.exampleInput.empty()) {
        core::GraphTensor t;
        t.known = true;
        t.shape = g.exampleInput;
        input = "input " + core::graphShapeText(t);
    }
    std::printf("total: %s parameters (%s), %s FLOPs for %s; %zu nodes, %zu edges\n",
                grouped(g.parameters).c_str(), bytesText(g.parameterBytes).c_str(),
                flopsText(g.flops).c_str(), input.c_str(), g.nodes.size(), g.edges.size());
    for (const auto& n : g.notes) std::printf("note: %s\n", n.c_str());
}

void writeFile(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    auto fail = [&](const std::string& why) {
        std::remove(tmp.c_str());
        throw UsageError(why);
    };
    {
        std::ofstream out(tmp, std::ios::binary);
        if (!out) throw UsageError("cannot write " + path);
        out << text;
        out.close();
        if (!out) fail("writing " + path + " failed (disk full?)");
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        fail("cannot write " + path + ": " + std::strerror(errno));
}

// A private directory for the model a run or spec is exported to (mkdtemp: not guessable, not
// shared), removed with what is in it.
struct TempModelDir {
    std::string dir;
    TempModelDir() {
        std::string pattern = (fs::temp_directory_path() / "lathe-graph-XXXXXX").string();
        if (!::mkdtemp(pattern.data())) throw UsageError("cannot create a temporary directory");
        dir = pattern;
    }
    ~TempModelDir() {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    TempModelDir(const TempModelDir&) = delete;
    TempModelDir& operator=(const TempModelDir&) = delete;
    std::string file() const { return dir + "/model.pt"; }
};

void runGraph(const GraphState& st) {
    const int sources = !st.file.empty() + !st.model.empty() + (st.run > 0) + !st.spec.empty();
    if (sources != 1)
        throw UsageError(
            "give one model: a FILE (.pt or .onnx), --model NAME[:V|@ALIAS], --run ID or --spec RUN.toml");
    std::string format = st.format;
    if (format.empty() && !st.output.empty()) {
        const auto ext = fs::path(st.output).extension().string();
        format = ext == ".dot" || ext == ".gv" ? "dot"
                 : ext == ".svg"               ? "svg"
                 : ext == ".png"               ? "png"
                                               : "json";
    }
    if (!format.empty() && format != "json" && format != "dot" && format != "svg" && format != "png")
        throw UsageError("--format " + format + ": one of json, dot, svg, png");
    if (format == "png" && st.output.empty() && ::isatty(STDOUT_FILENO))
        throw UsageError("--format png writes binary: give -o FILE.png or redirect stdout");
    if (st.collapseDepth < 0) throw UsageError("--collapse-depth must be 0 (everything expanded) or more");
    core::GraphOptions options;
    if (!st.inputShape.empty()) options.inputShape = parseShape(st.inputShape);
    options.inProcess = st.inProcess;

    std::string path = st.file, label = st.file;
    std::unique_ptr<TempModelDir> temp;  // removed however this ends
    if (!st.model.empty()) {
        std::unique_ptr<core::Registry> registry;
        try {
            registry = std::make_unique<core::Registry>(core::Store::resolvePath(st.common.db));
        } catch (const core::StoreError& ex) {
            throw UsageError(ex.what());
        }
        const auto v = registry->resolve(core::parseModelRef(st.model));  // NotFoundError names it
        path = v.path;
        label = v.name + ":" + std::to_string(v.version);
    } else if (!st.spec.empty()) {
        // The zoo network a run configuration names, before training: exported untrained.
        const core::RunSpec spec = core::loadRunSpec(st.spec);  // ConfigError names the file and key
        temp = std::make_unique<TempModelDir>();
        path = temp->file();
        core::exportSpecModel(spec, path);
        label = spec.model + " for " + spec.data;
    } else if (st.run > 0) {
        auto store = openStore(st.common);
        temp = std::make_unique<TempModelDir>();
        path = temp->file();
        core::exportRunModel(*store, st.run, path);
        label = "run " + std::to_string(st.run);
    }
    core::ModelGraph g = core::readModelGraph(path, options);
    temp.reset();
    g.name = label;

    if (st.common.json && format.empty()) format = "json";
    if (format.empty() || st.summary) {
        printSummary(g);
        if (format.empty()) return;
    }
    std::string text;
    if (format == "svg" || format == "png") {
        // Scopes deeper than --collapse-depth drawn as one box each.
        std::set<std::string> collapsed;
        if (st.collapseDepth > 0)
            for (const auto& s : core::graphScopes(g))
                if (std::count(s.begin(), s.end(), '.') == st.collapseDepth - 1) collapsed.insert(s);
        const auto view = core::buildGraphView(g, collapsed);
        core::LayoutOptions lo;
        lo.horizontal = st.horizontal;
        lo.title = label;
        try {
            text = core::renderGraphView(view, format, lo);
        } catch (const core::Error& ex) {
            throw UsageError(ex.what());
        }
    } else {
        text = format == "dot" ? core::graphDot(g, st.horizontal) : core::graphJson(g) + "\n";
    }
    if (st.output.empty()) {
        std::cout << text;
        return;
    }
    writeFile(st.output, text);
    if (!st.summary)
        std::printf("wrote the graph of %s (%zu nodes, %zu edges) as %s to %s\n", label.c_str(),
                    g.nodes.size(), g.edges.size(), format.c_str(), st.output.c_str());
}

}  // namespace

void registerGraph(CLI::App& app, int& exitCode) {
    (void)exitCode;
    auto st = std::make_shared<GraphState>();
    auto* cmd = app.add_subcommand(
        "graph",
        "a model's op graph: a per-layer summary (parameters, output shapes, FLOPs), JSON, Graphviz DOT, "
        "SVG or PNG");
    cmd->add_option("file", st->file, "a TorchScript (.pt, Lathe artifact or not) or ONNX (.onnx) file");
    cmd->add_option("--model", st->model, "a registered version: NAME, NAME:V or NAME@ALIAS");
    cmd->add_option("--run", st->run, "a recorded run: its model, exported from its last checkpoint");
    cmd->add_option(
        "--spec", st->spec,
        "a TOML run configuration: the zoo network it names, before training (e.g. model = \"cnn\")");
    cmd->add_option("--input-shape", st->inputShape,
                    "example input with the batch dimension, e.g. 1,3,224,224 (default: the artifact's "
                    "declared input, batch 1), run once to find shapes and FLOPs");
    cmd->add_option("--format", st->format,
                    "json, dot (Graphviz), svg or png (laid out by dot); default: the summary")
        ->check(CLI::IsMember({"json", "dot", "svg", "png"}));
    cmd->add_option("-o,--output", st->output,
                    "write it there instead of to stdout (format from .dot/.gv, .svg, .png, else json)");
    cmd->add_option("--collapse-depth", st->collapseDepth,
                    "svg/png: draw module scopes N levels deep as one box each (default 0: every op)");
    cmd->add_flag("--summary", st->summary, "the per-layer table (also with --format / -o)");
    cmd->add_flag("--horizontal", st->horizontal, "dot/svg/png: left to right instead of top to bottom");
    // Hidden: read TorchScript in this process. readModelGraph runs `lathectl graph FILE --format
    // json --in-process` as the child that reads TorchScript, so LibTorch crashing on a damaged
    // file ends that child, not the program that asked.
    cmd->add_flag("--in-process", st->inProcess, "read TorchScript in this process")->group("");
    addCommonOptions(cmd, st->common);
    cmd->callback([st] { runGraph(*st); });  // NotFoundError is a ConfigError: exit 2
}

}  // namespace lathe::cli
