// The Ask / Score tabs: a WAI-ARIA tab list (click, or the arrow keys between tabs).

/** Wires `tabs` ([name, tab element, panel element] each); `onSelect(name)` hears which one is shown. */
export function setUpTabs(tabs, onSelect) {
  function select(name, focus = false) {
    onSelect(name);
    for (const [tabName, tab, panel] of tabs) {
      const selected = tabName === name;
      tab.setAttribute("aria-selected", String(selected));
      tab.tabIndex = selected ? 0 : -1;
      panel.hidden = !selected;
      if (selected && focus) tab.focus();
    }
  }

  for (const [name, tab] of tabs) {
    tab.addEventListener("click", () => select(name));
    tab.addEventListener("keydown", (event) => {
      if (event.key !== "ArrowRight" && event.key !== "ArrowLeft") return;
      event.preventDefault();
      const index = tabs.findIndex(([tabName]) => tabName === name);
      const next = tabs[(index + (event.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
      select(next[0], true);
    });
  }
}
