#pragma once
// The run form: one field per RunSpec key, generated from core::specKeys() and validated as
// you type with core::checkSpecValue(), so the GUI and lathectl accept exactly the same values.
#include <QWidget>

#include <map>
#include <string>
#include <vector>

#include "lathe/core/run_spec.h"

class QCheckBox;
class QComboBox;
class QFormLayout;
class QLabel;
class QLineEdit;
class QPushButton;

namespace lathe::widgets {

class RunForm : public QWidget {
    Q_OBJECT
public:
    explicit RunForm(QWidget* parent = nullptr);

    /// The spec built from the fields with core::setSpecValue. Only meaningful when isValid().
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

    std::vector<Field> m_fields;
    std::map<QString, size_t> m_index;
    QLabel* m_errors = nullptr;
    QPushButton* m_start = nullptr;
    QPushButton* m_stop = nullptr;
    bool m_running = false;
    bool m_valid = false;
};

}  // namespace lathe::widgets
