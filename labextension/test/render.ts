/**
 * A small renderer for hook-free views: expands function components into the
 * host elements they draw, so that a test can look for text, attributes and
 * handlers without a DOM (the tests run in node).
 */
import * as React from 'react';

export interface INode {
  type: string;
  props: Record<string, any>;
  children: Child[];
}

export type Child = INode | string;

export function render(element: React.ReactNode): Child[] {
  if (element === null || element === undefined || element === false) {
    return [];
  }
  if (element === true) {
    return [];
  }
  if (typeof element === 'string' || typeof element === 'number') {
    return [String(element)];
  }
  if (Array.isArray(element)) {
    return element.flatMap(render);
  }
  const el = element as React.ReactElement<any>;
  if (el.type === React.Fragment) {
    return render(el.props.children);
  }
  const memo = el.type as { $$typeof?: symbol; type?: unknown };
  if (
    typeof memo === 'object' &&
    memo !== null &&
    memo.$$typeof === Symbol.for('react.memo') &&
    typeof memo.type === 'function'
  ) {
    // React.memo: draw what it wraps.
    return render((memo.type as (props: any) => React.ReactNode)(el.props));
  }
  if (typeof el.type === 'function') {
    return render((el.type as (props: any) => React.ReactNode)(el.props));
  }
  if (typeof el.type !== 'string') {
    throw new Error(`cannot render ${String(el.type)}`);
  }
  const { children, ...props } = el.props ?? {};
  return [{ type: el.type, props, children: render(children) }];
}

/** The text the nodes show, with a space between elements. */
export function text(nodes: Child[] | Child): string {
  const list = Array.isArray(nodes) ? nodes : [nodes];
  return list
    .map(n => (typeof n === 'string' ? n : text(n.children)))
    .join(' ')
    .replace(/\s+/g, ' ')
    .trim();
}

/** Every element, depth first, for which `match` holds. */
export function findAll(
  nodes: Child[] | Child,
  match: (node: INode) => boolean
): INode[] {
  const list = Array.isArray(nodes) ? nodes : [nodes];
  const found: INode[] = [];
  for (const n of list) {
    if (typeof n === 'string') {
      continue;
    }
    if (match(n)) {
      found.push(n);
    }
    found.push(...findAll(n.children, match));
  }
  return found;
}

/** Elements whose class list has `name`. */
export function byClass(nodes: Child[] | Child, name: string): INode[] {
  return findAll(nodes, n =>
    String(n.props.className ?? '')
      .split(/\s+/)
      .includes(name)
  );
}
