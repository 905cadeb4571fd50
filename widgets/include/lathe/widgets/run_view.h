#pragma once
// What the window does with every per-run view (one tab each below the runs table): show the
// selected runs, hand it the live run's events, tell it when a run ended, and clear it before
// the store goes. MainWindow holds its views in one list and does each of these in a loop, so a
// new view is one addRunView() line there. A view derives QWidget (first, for moc) and RunView.
#include <QString>

#include <cstdint>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/store.h"

class QWidget;

namespace lathe::widgets {

class RunView {
public:
    virtual ~RunView() = default;
    RunView(const RunView&) = delete;
    RunView& operator=(const RunView&) = delete;

    /// The view itself, for its tab.
    virtual QWidget* widget() = 0;
    virtual QString tabTitle() const = 0;
    virtual QString tabToolTip() const { return {}; }

    /// Shows the selected runs (ascending ids; empty: none) from `store`, which must stay until
    /// clear(). Single-run views show the first one and keep what they show when it is already
    /// that run; a view whose read is heavy (the profile) may wait until it is visible.
    virtual void showRuns(const core::Store& store, const std::vector<int64_t>& runIds) = 0;
    /// Forgets what is shown and waits for any read of the store in flight: call it before the
    /// store goes.
    virtual void clear() = 0;

    /// Live events of the running run. Views that plot them keep the points of a run that is not
    /// shown, for when it is selected.
    virtual void onEvents(int64_t /*runId*/, const std::vector<core::Event>& /*events*/) {}
    /// Drops what is kept of a run's live events (another run started, or the store goes).
    virtual void forgetLive(int64_t /*runId*/) {}
    /// A run ended: the store now holds all of it (the profile re-reads it if it is the run shown).
    virtual void onRunFinished(const core::Store& /*store*/, int64_t /*runId*/) {}

protected:
    RunView() = default;
};

}  // namespace lathe::widgets
