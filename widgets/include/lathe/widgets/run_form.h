#pragma once
// The run form: one field per RunSpec key, generated from core::specKeys() and validated as
// you type with core::checkSpecValue(), so the GUI and lathectl accept exactly the same values.
// Its Target section says where the ranks run: this machine (nproc from the form), or hosts of
// the workspace's inventory with slots each (one rank per slot, nproc their total), as
// `lathectl train --hosts NAME:SLOTS[,...] [--master-addr A] [--stage]`.
#include <QStringList>
#include <QWidget>

#include <map>
#include <string>
#include <vector>

#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"
#include "lathe/widgets/run_target.h"

class QCheckBox;
class QComboBox;
class QFormLayout;
class QGroupBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QRadioButton;
class QSpinBox;
class QVBoxLayout;

namespace lathe::widgets {

class RunForm : public QWidget {
    Q_OBJECT
public:
    explicit RunForm(QWidget* parent = nullptr);

    /// The spec built from the fields with core::setSpecValue. Only meaningful when isValid().
    /// With the Hosts target, nproc is the total of the slots chosen.
    core::RunSpec spec() const;
    /// Fills every field from `spec` (e.g. to re-run an earlier configuration).
    void setSpec(const core::RunSpec& spec);

    bool isValid() const;
    bool isRunning() const { return m_running; }

    // Field access by spec key ("lr", "data", ...), for wiring and tests.
    bool hasField(const QString& key) const;
    QString fieldText(const QString& key) const;
    void setFieldText(const QString& key, const QString& text);
    /// The current validation message of a field; empty when valid.
    QString fieldError(const QString& key) const;
    QWidget* fieldWidget(const QString& key) const;
    /// False for a field that does not apply (profile schedule with Profile off, dynamic
    /// loss-scale parameters with another mode, chunk / error feedback / stochastic rounding
    /// without int8/int4 compression); such fields are greyed and not validated.
    bool isFieldActive(const QString& key) const;
    /// All messages currently shown under the form.
    QString errorText() const;

    /// The workspace's versioned data sets (lathectl data), offered in the data field as
    /// "dataset:NAME" after the built-in sources; the text typed stays as it is.
    void setDataSets(const QStringList& names);

    // ---- Target ----------------------------------------------------------------------
    /// The workspace's hosts, offered under Target → Hosts in this order (rank order). Slots
    /// chosen for hosts that are still there are kept (capped at their slots).
    void setHosts(const std::vector<core::HostRecord>& hosts);
    /// Target: this machine (false, the default) or hosts (true).
    void setTargetHosts(bool hosts);
    bool isTargetHosts() const;
    /// The hosts offered, in order.
    QStringList targetHostNames() const;
    /// Slots of a host for this run (0: not used; capped at the host's slots). False when the
    /// form offers no such host.
    bool setHostSlots(const QString& host, int slots);
    int hostSlots(const QString& host) const;
    QSpinBox* hostSlotsBox(const QString& host) const;
    void setMasterAddr(const QString& address);
    void setStageLathectl(bool stage);
    /// Where the run's ranks go: isLocal() with This machine; with Hosts, each host with slots
    /// > 0 in the order offered, the master address and whether to stage lathectl.
    RunTarget target() const;
    /// The line under the hosts ("4 ranks on gpu-a:2,gpu-b:2").
    QString targetSummary() const;
    QGroupBox* targetGroup() const { return m_targetBox; }

    QPushButton* startButton() const { return m_start; }
    QPushButton* stopButton() const { return m_stop; }

public Q_SLOTS:
    void setRunning(bool running);

Q_SIGNALS:
    void startRequested(const lathe::core::RunSpec& spec);
    void stopRequested();
    void validityChanged(bool valid);

private:
    struct Field {
        core::SpecKey key;
        QLineEdit* edit = nullptr;   // text fields, and the line edit of an editable combo
        QComboBox* combo = nullptr;  // choices and the data source
        QCheckBox* check = nullptr;  // "bool" keys
        QString error;
        bool inactive = false;  // greyed out because another field makes it irrelevant
    };

    void addField(QFormLayout* layout, const core::SpecKey& key, const core::RunSpec& defaults);
    QString textOf(const Field& f) const;
    void revalidate();
    void updateDependentFields();
    void applyEnabled(Field& f);
    QWidget* widgetOf(const Field& f) const;
    void applyFieldStyle(Field& f);
    void onStartClicked();
    void buildTarget(QVBoxLayout* outer);
    void rebuildHostRows();
    void updateTarget();
    QStringList targetMessages() const;

    std::vector<Field> m_fields;
    std::map<QString, size_t> m_index;
    QLabel* m_errors = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_stop = nullptr;
    bool m_running = false;
    bool m_valid = false;

    struct HostRow {
        std::string name;
        int maxSlots = 1;
        QSpinBox* slots = nullptr;
    };
    std::vector<core::HostRecord> m_inventory;
    std::vector<HostRow> m_hostRows;
    QGroupBox* m_targetBox = nullptr;
    QRadioButton* m_targetLocal = nullptr;
    QRadioButton* m_targetHosts = nullptr;
    QWidget* m_hostsPanel = nullptr;
    QVBoxLayout* m_hostsPanelLayout = nullptr;
    QWidget* m_hostRowsWidget = nullptr;
    QLabel* m_noHosts = nullptr;
    QLineEdit* m_masterAddr = nullptr;
    QCheckBox* m_stage = nullptr;
    QLabel* m_targetSummary = nullptr;
};

}  // namespace lathe::widgets
