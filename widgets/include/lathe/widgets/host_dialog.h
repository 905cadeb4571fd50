#pragma once
// Add or edit one host of the workspace's inventory: name (fixed when editing), address
// ([user@]host[:port] or an ssh-config alias), port (0: the ssh config's, else 22), user, identity
// file (with a file picker), lathectl path on the host, and slots (1..4096). OK hands the record
// to a commit function (Store::addHost / updateHost); when that fails the dialog stays open with
// the message beneath the fields and everything typed kept.
#include <QDialog>
#include <QString>

#include <functional>

#include "lathe/core/store.h"

class QDialogButtonBox;
class QLabel;
class QLineEdit;
class QSpinBox;
class QToolButton;

namespace lathe::widgets {

class HostDialog : public QDialog {
    Q_OBJECT
public:
    /// Stores the record; returns the error to show (empty: stored).
    using Commit = std::function<QString(const core::HostRecord& host)>;

    /// `editing`: the name is shown but cannot be changed. `initial` fills the fields.
    HostDialog(bool editing, const core::HostRecord& initial, Commit commit, QWidget* parent = nullptr);

    bool isEditing() const { return m_editing; }
    /// The record the fields describe: a user or port written in the address moves to its own
    /// field (as `lathectl hosts add --address alice@gpu:2222`), and a relative identity path is
    /// made absolute. Throws core::ConfigError when the address and the fields disagree.
    core::HostRecord record() const;
    void setRecord(const core::HostRecord& host);
    /// The message under the fields (empty: none).
    QString errorText() const;

    QLineEdit* nameEdit() const { return m_name; }
    QLineEdit* addressEdit() const { return m_address; }
    QSpinBox* portBox() const { return m_port; }
    QLineEdit* userEdit() const { return m_user; }
    QLineEdit* identityEdit() const { return m_identity; }
    QToolButton* identityBrowseButton() const { return m_browse; }
    QLineEdit* lathectlEdit() const { return m_lathectl; }
    QSpinBox* slotsBox() const { return m_slots; }
    QDialogButtonBox* buttonBox() const { return m_buttons; }

public Q_SLOTS:
    /// Commits; closes only when the record was stored.
    void accept() override;

private:
    void showError(const QString& text);
    void browseIdentity();

    bool m_editing = false;
    Commit m_commit;
    double m_addedAt = 0;
    QLineEdit* m_name = nullptr;
    QLineEdit* m_address = nullptr;
    QSpinBox* m_port = nullptr;
    QLineEdit* m_user = nullptr;
    QLineEdit* m_identity = nullptr;
    QToolButton* m_browse = nullptr;
    QLineEdit* m_lathectl = nullptr;
    QSpinBox* m_slots = nullptr;
    QLabel* m_error = nullptr;
    QDialogButtonBox* m_buttons = nullptr;
};

}  // namespace lathe::widgets
