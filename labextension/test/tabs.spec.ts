import { describe, expect, it, vi } from 'vitest';

import { TabBar } from '../src/views/frame/tabBar';
import { ITab } from '../src/views/tabs';
import { plainTrans } from '../src/present/trans';

const trans = plainTrans as any;

function tab(id: string): ITab {
  return { id, label: () => id.toUpperCase(), view: () => null };
}

describe('TabBar', () => {
  it('shows nothing while there is one tab', () => {
    expect(
      TabBar({
        tabs: [tab('overview')],
        active: 'overview',
        onSelect: vi.fn(),
        trans
      })
    ).toBeNull();
  });

  it('shows a tab per entry, the active one selected', () => {
    const onSelect = vi.fn();
    const bar = TabBar({
      tabs: [tab('overview'), tab('history')],
      active: 'history',
      onSelect,
      trans
    })!;
    expect(bar.props.role).toBe('tablist');
    const buttons = bar.props.children as any[];
    expect(buttons.map(b => b.props.children)).toEqual(['OVERVIEW', 'HISTORY']);
    expect(buttons.map(b => b.props['aria-selected'])).toEqual([false, true]);
    expect(buttons[1].props.className).toContain('jp-mod-active');
    buttons[0].props.onClick();
    expect(onSelect).toHaveBeenCalledWith('overview');
  });
});
