#pragma once
// Durations as people read them in a profiler: 850 ns, 12.4 µs, 3.21 ms, 1.250 s.
#include <QString>

#include <cmath>

namespace lathe::widgets {

inline QString formatNs(double ns) {
    const double a = std::abs(ns);
    if (a < 1e3) return QStringLiteral("%1 ns").arg(ns, 0, 'f', 0);
    if (a < 1e6) return QStringLiteral("%1 µs").arg(ns / 1e3, 0, 'f', a < 1e4 ? 2 : 1);
    if (a < 1e9) return QStringLiteral("%1 ms").arg(ns / 1e6, 0, 'f', a < 1e7 ? 2 : 1);
    return QStringLiteral("%1 s").arg(ns / 1e9, 0, 'f', 3);
}

/// An axis label for `ns` whose precision follows the tick spacing `stepNs`.
inline QString formatDuration(double ns, double stepNs) {
    const char* unit = "ns";
    double scale = 1;
    if (stepNs >= 1e8) {
        unit = "s";
        scale = 1e9;
    } else if (stepNs >= 1e5) {
        unit = "ms";
        scale = 1e6;
    } else if (stepNs >= 1e2) {
        unit = "µs";
        scale = 1e3;
    }
    const double step = stepNs / scale;
    const int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
    if (std::abs(ns) < stepNs * 1e-6) ns = 0;  // no "-0"
    return QStringLiteral("%1 %2").arg(ns / scale, 0, 'f', decimals).arg(QString::fromUtf8(unit));
}

}  // namespace lathe::widgets
