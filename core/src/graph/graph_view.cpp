// What of a model graph is shown (graph_layout.h): scopes collapsed or expanded, and the
// profile's op times matched to nodes. Plain data, no Graphviz.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

#include "graph_names.h"
#include "lathe/core/graph_layout.h"

namespace lathe::core {

namespace {

int depthOf(const std::string& scope) {
    return scope.empty() ? 0 : 1 + static_cast<int>(std::count(scope.begin(), scope.end(), '.'));
}

std::string parentOf(const std::string& scope) {
    const auto p = scope.rfind('.');
    return p == std::string::npos ? "" : scope.substr(0, p);
}

// The outermost collapsed scope among `scope` and its ancestors, or "" when none is.
std::string collapsedAncestor(const std::string& scope, const std::set<std::string>& collapsed) {
    if (collapsed.empty() || scope.empty()) return "";
    std::string prefix;
    size_t start = 0;
    while (true) {
        const auto dot = scope.find('.', start);
        prefix = scope.substr(0, dot);
        if (collapsed.count(prefix)) return prefix;
        if (dot == std::string::npos) break;
        start = dot + 1;
    }
    return "";
}

std::string countText(int64_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

std::set<std::string> graphScopes(const ModelGraph& g) {
    std::set<std::string> scopes;
    for (const auto& n : g.nodes) {
        size_t start = 0;
        while (!n.scope.empty()) {
            const auto dot = n.scope.find('.', start);
            scopes.insert(n.scope.substr(0, dot));
            if (dot == std::string::npos) break;
            start = dot + 1;
        }
    }
    return scopes;
}

namespace {

// expandScope with the graph's scopes already listed.
void expandIn(const std::map<std::string, std::vector<std::string>>& children,
              std::set<std::string>& collapsed, const std::string& scope) {
    collapsed.erase(scope);
    const auto it = children.find(scope);
    if (it != children.end()) collapsed.insert(it->second.begin(), it->second.end());
}

std::map<std::string, std::vector<std::string>> childrenOf(const std::set<std::string>& scopes) {
    std::map<std::string, std::vector<std::string>> children;
    for (const auto& s : scopes) children[parentOf(s)].push_back(s);
    return children;
}

}  // namespace

std::set<std::string> defaultCollapsed(const ModelGraph& g, size_t maxVisible) {
    if (g.nodes.size() <= maxVisible) return {};
    // Start from the top-level scopes closed, then open them a group of siblings at a time
    // (breadth first) wherever the view still fits: a model of 16 layers of 300 ops opens to its
    // 16 layers rather than staying one box, and never to two layers open and fourteen closed.
    const auto children = childrenOf(graphScopes(g));
    std::set<std::string> collapsed;
    if (const auto top = children.find(""); top != children.end())
        collapsed.insert(top->second.begin(), top->second.end());
    std::vector<std::vector<std::string>> queue{{collapsed.begin(), collapsed.end()}};
    for (size_t head = 0; head < queue.size() && head < 200; ++head) {
        const auto group = queue[head];
        auto trial = collapsed;
        for (const auto& s : group) expandIn(children, trial, s);
        if (buildGraphView(g, trial).nodes.size() > maxVisible) continue;
        collapsed = std::move(trial);
        for (const auto& s : group)
            if (const auto c = children.find(s); c != children.end()) queue.push_back(c->second);
    }
    return collapsed;
}

void expandScope(const ModelGraph& g, std::set<std::string>& collapsed, const std::string& scope) {
    expandIn(childrenOf(graphScopes(g)), collapsed, scope);
}

void collapseScope(std::set<std::string>& collapsed, const std::string& scope) {
    for (auto it = collapsed.begin(); it != collapsed.end();)
        it = it->rfind(scope + ".", 0) == 0 ? collapsed.erase(it) : std::next(it);
    collapsed.insert(scope);
}

GraphView buildGraphView(const ModelGraph& g, const std::set<std::string>& collapsed) {
    GraphView v;
    v.viewOf.assign(g.nodes.size(), -1);
    std::unordered_map<std::string, int64_t> scopeBox;  // collapsed scope -> view node
    std::map<std::string, int> clusterOf;               // expanded scope -> cluster
    // The cluster for an expanded scope, its ancestors' (those with two boxes or more) first.
    std::unordered_map<std::string, int> boxesIn;
    auto cluster = [&](const std::string& scope, auto&& self) -> int {
        if (scope.empty()) return -1;
        const auto it = clusterOf.find(scope);
        if (it != clusterOf.end()) return it->second;
        std::string parent = parentOf(scope);
        while (!parent.empty() && boxesIn[parent] < 2) parent = parentOf(parent);
        const int p = self(parent, self);
        ViewCluster c;
        c.scope = scope;
        c.label = p < 0 ? scope : scope.substr(parent.size() + 1);
        c.parent = p;
        v.clusters.push_back(c);
        const int id = static_cast<int>(v.clusters.size()) - 1;
        clusterOf[scope] = id;
        return id;
    };
    // A scope becomes a cluster only around two boxes or more: a module of one op is already
    // named by that op's box.
    {
        std::set<std::string> seenBoxes;
        for (const auto& n : g.nodes) {
            const std::string top = collapsedAncestor(n.scope, collapsed);
            if (!top.empty() && !seenBoxes.insert(top).second) continue;
            const std::string& home = top.empty() ? n.scope : parentOf(top);
            std::string s = home;
            while (!s.empty()) {
                ++boxesIn[s];
                s = parentOf(s);
            }
        }
    }
    auto clusterFor = [&](std::string scope) {
        while (!scope.empty() && boxesIn[scope] < 2) scope = parentOf(scope);
        return cluster(scope, cluster);
    };
    for (const auto& n : g.nodes) {
        const std::string top = collapsedAncestor(n.scope, collapsed);
        if (!top.empty()) {
            auto it = scopeBox.find(top);
            if (it == scopeBox.end()) {
                ViewNode box;
                box.scope = top;
                const std::string parent = parentOf(top);
                box.label = parent.empty() ? top : top.substr(parent.size() + 1);
                box.category = "module";
                box.members = 0;
                box.cluster = clusterFor(parent);
                v.nodes.push_back(box);
                it = scopeBox.emplace(top, static_cast<int64_t>(v.nodes.size()) - 1).first;
            }
            auto& box = v.nodes[static_cast<size_t>(it->second)];
            ++box.members;
            box.parameters += n.parameters;
            box.flops += n.flops;
            v.viewOf[static_cast<size_t>(n.id)] = it->second;
            continue;
        }
        ViewNode vn;
        vn.node = n.id;
        vn.scope = n.scope;
        vn.category = n.category;
        vn.label = n.category == "input" || n.category == "output" ? n.name : shortOpName(n.op);
        if (!n.outputs.empty() && n.outputs[0].known)
            vn.detail = graphShapeText(n.outputs[0]);
        else if (n.category == "output" && !n.inputs.empty() && n.inputs[0].known)
            vn.detail = graphShapeText(n.inputs[0]);
        vn.parameters = n.parameters;
        vn.flops = n.flops;
        vn.cluster = clusterFor(n.scope);
        v.nodes.push_back(vn);
        v.viewOf[static_cast<size_t>(n.id)] = static_cast<int64_t>(v.nodes.size()) - 1;
    }
    for (auto& vn : v.nodes)
        if (vn.node < 0) vn.detail = countText(vn.members, "op");
    // Edges between boxes, once per pair; labelled with the tensor when one kind flows.
    std::map<std::pair<int64_t, int64_t>, std::pair<std::string, int>> pairs;
    std::vector<std::pair<int64_t, int64_t>> order;
    for (const auto& e : g.edges) {
        if (e.from < 0 || e.to < 0 || static_cast<size_t>(e.from) >= g.nodes.size() ||
            static_cast<size_t>(e.to) >= g.nodes.size())
            continue;
        const int64_t a = v.viewOf[static_cast<size_t>(e.from)], b = v.viewOf[static_cast<size_t>(e.to)];
        if (a == b) continue;
        const std::string label = e.tensor.known ? graphShapeText(e.tensor) : "";
        auto [it, fresh] = pairs.try_emplace({a, b}, label, 1);
        if (fresh)
            order.push_back({a, b});
        else if (it->second.first != label)
            it->second.first.clear();
    }
    for (const auto& [a, b] : order) v.edges.push_back({a, b, pairs[{a, b}].first});
    return v;
}

std::pair<double, double> viewNodeSize(const ViewNode& n) {
    // Helvetica-like 10 pt text: about 6 pt per character; two lines when there is a detail.
    auto chars = [](const std::string& s) {
        size_t n = 0;
        for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // UTF-8 code points
        return static_cast<double>(n);
    };
    const double text = std::max(chars(n.label) * 6.6, chars(n.detail) * 5.6);
    const double w = std::clamp(text + 18, 54.0, 360.0);
    const double h = n.detail.empty() ? 24 : 36;
    return {w, h};
}

std::vector<double> graphNodeTimes(const ModelGraph& g, const std::vector<ProfileSpan>& spans) {
    std::vector<double> sum(g.nodes.size(), 0);
    std::vector<int> hits(g.nodes.size(), 0);
    // Per recorded step: the training thread's forward phase, and the op spans in it that no
    // other op span encloses (aten::conv2d, not the aten::convolution it calls), in start order.
    std::map<int64_t, std::pair<int64_t, int64_t>> forward;  // step -> [start, end)
    for (const auto& s : spans)
        if (s.kind == ProfileSpan::Kind::Phase && s.name == "forward" && s.thread == 0)
            forward[s.step] = {s.startNs, s.startNs + s.durationNs};
    std::map<int64_t, std::vector<const ProfileSpan*>> ops;
    for (const auto& s : spans) {
        if (s.kind != ProfileSpan::Kind::Op || s.thread != 0) continue;
        const auto f = forward.find(s.step);
        if (f == forward.end() || s.startNs < f->second.first || s.startNs >= f->second.second) continue;
        ops[s.step].push_back(&s);
    }
    for (auto& [step, list] : ops) {
        // Every op span of the pass, outer before inner at the same start: the graph may hold
        // the op the training code called (aten::linear) or what it was exported as (aten::t,
        // aten::addmm, which ran nested inside it).
        std::sort(list.begin(), list.end(), [](const ProfileSpan* a, const ProfileSpan* b) {
            return a->startNs != b->startNs ? a->startNs < b->startNs : a->durationNs > b->durationNs;
        });
        // Greedy alignment in execution order: each node takes the next span with its op's name
        // within a look-ahead (ops nested in a matched one, folded by the graph or added by the
        // training pass are passed over).
        size_t cursor = 0;
        for (const auto& n : g.nodes) {
            if (n.category == "input" || n.category == "output") continue;
            for (size_t k = cursor; k < list.size() && k < cursor + 48; ++k)
                if (list[k]->name == n.op) {
                    sum[static_cast<size_t>(n.id)] += static_cast<double>(list[k]->durationNs);
                    ++hits[static_cast<size_t>(n.id)];
                    cursor = k + 1;
                    break;
                }
        }
    }
    std::vector<double> out(g.nodes.size(), -1);
    for (size_t i = 0; i < out.size(); ++i)
        if (hits[i]) out[i] = sum[i] / hits[i];
    return out;
}

}  // namespace lathe::core
