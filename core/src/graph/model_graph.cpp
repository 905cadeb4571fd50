// The torch-free half of model graphs (model_graph.h): JSON, DOT, the summary's rows, colours.
// The readers live in the torch-backed library (torchscript_graph.cpp).
#include "lathe/core/model_graph.h"

#include "lathe/core/error.h"

#include "graph_names.h"

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace lathe::core {

namespace {

using Json = nlohmann::ordered_json;  // attributes keep their order through graphFromJson

Json tensorJson(const GraphTensor& t) {
    if (!t.known) return {{"shape", nullptr}, {"dtype", nullptr}};
    return {{"shape", t.shape}, {"dtype", t.dtype}};
}

// DOT string literal: quotes and backslashes escaped, newlines as \n.
std::string dotQuote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\')
            out += '\\', out += c;
        else if (c == '\n')
            out += "\\n";
        else if (static_cast<unsigned char>(c) >= 0x20)
            out += c;
    }
    return out + "\"";
}

}  // namespace

std::string shortOpName(const std::string& op) {
    const auto p = op.rfind("::");
    return p == std::string::npos ? op : op.substr(p + 2);
}

void nameGraphNodes(ModelGraph& g) {
    auto base = [](const std::string& op) {
        std::string s = shortOpName(op);
        if (s.size() > 1 && s.back() == '_' && s[s.size() - 2] != '_') s.pop_back();
        return s;
    };
    auto fixed = [](const GraphNode& n) { return n.category == "input" || n.category == "output"; };
    std::map<std::string, int> perScope;
    for (const auto& n : g.nodes)
        if (!fixed(n)) ++perScope[n.scope];
    std::map<std::string, int> seen;
    std::set<std::string> used;
    for (const auto& n : g.nodes)
        if (fixed(n)) used.insert(n.name);
    for (auto& n : g.nodes) {
        if (fixed(n)) continue;
        std::string name;
        if (!n.scope.empty() && perScope[n.scope] == 1) {
            name = n.scope;
        } else {
            const std::string b = (n.scope.empty() ? "" : n.scope + "/") + base(n.op);
            const int k = ++seen[b];
            name = k == 1 ? b : b + "_" + std::to_string(k);
        }
        while (!used.insert(name).second) name += "'";
        n.name = name;
    }
}

std::string graphShapeText(const GraphTensor& t) {
    if (!t.known) return "?";
    std::string s = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    return s + "]";
}

const char* graphCategoryColor(const std::string& category) {
    static const std::map<std::string, const char*> colors{
        {"conv", "#4e79a7"},       {"linear", "#59a14f"},    {"norm", "#9c755f"},
        {"activation", "#f28e2b"}, {"pool", "#76b7b2"},      {"elementwise", "#edc948"},
        {"reshape", "#bab0ac"},    {"attention", "#b07aa1"}, {"embedding", "#ff9da7"},
        {"dropout", "#d4d4d4"},    {"quantized", "#e15759"}, {"control", "#8c8c8c"},
        {"input", "#ffffff"},      {"output", "#ffffff"}};
    const auto it = colors.find(category);
    return it == colors.end() ? "#e0e0e0" : it->second;
}

std::string graphJson(const ModelGraph& g, int indent) {
    Json nodes = Json::array(), edges = Json::array();
    for (const auto& n : g.nodes) {
        Json attrs = Json::object();
        for (const auto& [k, v] : n.attributes) attrs[k] = v;
        Json ins = Json::array(), outs = Json::array();
        for (const auto& t : n.inputs) ins.push_back(tensorJson(t));
        for (const auto& t : n.outputs) outs.push_back(tensorJson(t));
        nodes.push_back({{"id", n.id},
                         {"name", n.name},
                         {"op", n.op},
                         {"category", n.category},
                         {"scope", n.scope},
                         {"attributes", attrs},
                         {"inputs", ins},
                         {"outputs", outs},
                         {"parameters", n.parameters},
                         {"parameter_bytes", n.parameterBytes},
                         {"flops", n.flops}});
    }
    for (const auto& e : g.edges) {
        auto j = tensorJson(e.tensor);
        j["from"] = e.from;
        j["to"] = e.to;
        edges.push_back(j);
    }
    Json j{{"source", g.source},
           {"name", g.name},
           {"parameters", g.parameters},
           {"parameter_bytes", g.parameterBytes},
           {"flops", g.flops},
           {"example_input", g.exampleInput.empty() ? Json(nullptr) : Json(g.exampleInput)},
           {"notes", g.notes},
           {"nodes", nodes},
           {"edges", edges}};
    return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

namespace {

GraphTensor tensorFromJson(const Json& j) {
    GraphTensor t;
    if (!j.is_object()) throw ConfigError("a tensor is not an object");
    const auto shape = j.find("shape");
    if (shape == j.end() || shape->is_null()) return t;
    t.known = true;
    t.shape = shape->get<std::vector<int64_t>>();
    const auto dtype = j.find("dtype");
    if (dtype != j.end() && !dtype->is_null()) t.dtype = dtype->get<std::string>();
    return t;
}

std::vector<GraphTensor> tensorsFromJson(const Json& j) {
    std::vector<GraphTensor> out;
    for (const auto& t : j) out.push_back(tensorFromJson(t));
    return out;
}

}  // namespace

ModelGraph graphFromJson(const std::string& text) {
    ModelGraph g;
    try {
        const Json j = Json::parse(text);
        g.source = j.at("source").get<std::string>();
        g.name = j.at("name").get<std::string>();
        g.parameters = j.at("parameters").get<int64_t>();
        g.parameterBytes = j.at("parameter_bytes").get<int64_t>();
        g.flops = j.at("flops").get<double>();
        if (!j.at("example_input").is_null())
            g.exampleInput = j.at("example_input").get<std::vector<int64_t>>();
        g.notes = j.at("notes").get<std::vector<std::string>>();
        for (const auto& jn : j.at("nodes")) {
            GraphNode n;
            n.id = jn.at("id").get<int64_t>();
            if (n.id != static_cast<int64_t>(g.nodes.size()))
                throw ConfigError("node " + std::to_string(g.nodes.size()) + " has id " +
                                  std::to_string(n.id));
            n.name = jn.at("name").get<std::string>();
            n.op = jn.at("op").get<std::string>();
            n.category = jn.at("category").get<std::string>();
            n.scope = jn.at("scope").get<std::string>();
            for (const auto& [k, v] : jn.at("attributes").items())
                n.attributes.emplace_back(k, v.get<std::string>());
            n.inputs = tensorsFromJson(jn.at("inputs"));
            n.outputs = tensorsFromJson(jn.at("outputs"));
            n.parameters = jn.at("parameters").get<int64_t>();
            n.parameterBytes = jn.at("parameter_bytes").get<int64_t>();
            n.flops = jn.at("flops").get<double>();
            g.nodes.push_back(std::move(n));
        }
        const auto count = static_cast<int64_t>(g.nodes.size());
        for (const auto& je : j.at("edges")) {
            GraphEdge e;
            e.from = je.at("from").get<int64_t>();
            e.to = je.at("to").get<int64_t>();
            if (e.from < 0 || e.from >= count || e.to < 0 || e.to >= count)
                throw ConfigError("an edge names a node that is not there");
            e.tensor = tensorFromJson(je);
            g.edges.push_back(std::move(e));
        }
    } catch (const nlohmann::json::exception& ex) {
        throw ConfigError(std::string("not a model graph in JSON: ") + ex.what());
    } catch (const ConfigError& ex) {
        throw ConfigError(std::string("not a model graph in JSON: ") + ex.what());
    }
    return g;
}

std::string graphDot(const ModelGraph& g, bool horizontal) {
    std::ostringstream out;
    out << "digraph " << dotQuote(g.name.empty() ? "model" : g.name) << " {\n"
        << "  rankdir=" << (horizontal ? "LR" : "TB") << ";\n"
        << "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n"
        << "  edge [fontname=\"Helvetica\", fontsize=8];\n";
    // Nodes grouped into nested clusters by scope: a tree of scope prefixes.
    struct Cluster {
        std::map<std::string, Cluster> children;
        std::vector<const GraphNode*> nodes;
    };
    Cluster root;
    for (const auto& n : g.nodes) {
        Cluster* c = &root;
        std::string prefix;
        std::stringstream parts(n.scope);
        std::string part;
        while (!n.scope.empty() && std::getline(parts, part, '.')) {
            prefix += (prefix.empty() ? "" : ".") + part;
            c = &c->children[prefix];
        }
        c->nodes.push_back(&n);
    }
    int clusterId = 0;
    std::function<void(const Cluster&, const std::string&, int)> emit =
        [&](const Cluster& c, const std::string& label, int depth) {
            const std::string pad(static_cast<size_t>(2 * depth), ' ');
            if (!label.empty())
                out << pad << "subgraph cluster_" << clusterId++ << " {\n"
                    << pad << "  label=" << dotQuote(label) << "; style=rounded; color=\"#bbbbbb\";\n";
            for (const GraphNode* n : c.nodes) {
                std::string text =
                    n->category == "input" || n->category == "output" ? n->name : shortOpName(n->op);
                if (!n->outputs.empty() && n->outputs[0].known) text += "\n" + graphShapeText(n->outputs[0]);
                out << pad << "  n" << n->id << " [label=" << dotQuote(text)
                    << ", tooltip=" << dotQuote(n->name)
                    << ", fillcolor=" << dotQuote(graphCategoryColor(n->category)) << "];\n";
            }
            for (const auto& [name, child] : c.children) emit(child, name, depth + 1);
            if (!label.empty()) out << pad << "}\n";
        };
    emit(root, "", 0);
    for (const auto& e : g.edges) {
        out << "  n" << e.from << " -> n" << e.to;
        if (e.tensor.known) out << " [label=" << dotQuote(graphShapeText(e.tensor)) << "]";
        out << ";\n";
    }
    out << "}\n";
    return out.str();
}

std::vector<GraphLayer> graphLayers(const ModelGraph& g) {
    std::vector<GraphLayer> rows;
    for (const auto& n : g.nodes) {
        if (n.category == "input" || n.category == "output" || n.category == "reshape") continue;
        if (n.parameters == 0 && n.flops == 0) continue;
        GraphLayer row;
        row.name = n.name;
        row.op = n.op;
        row.category = n.category;
        row.outputShape = n.outputs.empty() ? "?" : graphShapeText(n.outputs[0]);
        row.parameters = n.parameters;
        row.flops = n.flops;
        rows.push_back(std::move(row));
    }
    return rows;
}

}  // namespace lathe::core
