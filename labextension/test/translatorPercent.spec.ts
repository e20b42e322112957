/**
 * JupyterLab's translator reads `%` in a message: `%1`, `%2`… are filled in
 * with the arguments and `%%` becomes `%`. A magic such as `%%gpumem` written in
 * a message therefore reaches the user as `%gpumem`; it has to be an argument.
 */
import { readdirSync, readFileSync, statSync } from 'fs';
import { join } from 'path';
import * as React from 'react';
import * as ts from 'typescript';
import { nullTranslator } from '@jupyterlab/translation';
import { describe, expect, it, vi } from 'vitest';

import { TRANSLATION_DOMAIN } from '../src/present/trans';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import { DEFAULT_SORT, HistoryView } from '../src/views/history/historyTable';
import { helloResult, okReply } from './fixtures';
import { byClass, render, text } from './render';

const SRC = join(__dirname, '..', 'src');

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap(name => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) {
      return sources(path);
    }
    return /\.tsx?$/.test(name) ? [path] : [];
  });
}

/** Which arguments of each translator method are messages (not values). */
const MESSAGE_ARGS: Record<string, number[]> = {
  __: [0],
  _n: [0, 1],
  _p: [1],
  _np: [1, 2]
};

interface IMessage {
  where: string;
  message: string;
}

function translatedMessages(path: string): IMessage[] {
  const file = ts.createSourceFile(
    path,
    readFileSync(path, 'utf8'),
    ts.ScriptTarget.Latest,
    true
  );
  const found: IMessage[] = [];
  const visit = (node: ts.Node): void => {
    if (
      ts.isCallExpression(node) &&
      ts.isPropertyAccessExpression(node.expression) &&
      node.expression.name.text in MESSAGE_ARGS
    ) {
      for (const i of MESSAGE_ARGS[node.expression.name.text]) {
        const arg = node.arguments[i];
        if (arg && ts.isStringLiteralLike(arg)) {
          const { line } = file.getLineAndCharacterOfPosition(arg.getStart());
          found.push({ where: `${path}:${line + 1}`, message: arg.text });
        }
      }
    }
    ts.forEachChild(node, visit);
  };
  visit(file);
  return found;
}

describe('messages given to the translator', () => {
  it('use % only for the placeholders %1, %2…', () => {
    const messages = sources(SRC).flatMap(translatedMessages);
    // the scan finds the messages (a parser that found none would pass)
    expect(messages.length).toBeGreaterThan(100);
    const stray = messages
      .filter(m => /%(?!\d)/.test(m.message))
      .map(m => `${m.where}: ${m.message}`);
    expect(stray).toEqual([]);
  });

  it("the History tab's hint names %%gpumem and %gpumem auto as written", () => {
    const events: GpuMemEvent[] = [
      { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
      {
        type: 'reply',
        action: 'hello',
        reply: okReply('hello', helloResult())
      },
      { type: 'reading_sent', view: 'history' },
      {
        type: 'reply',
        action: 'history',
        reply: okReply('history', { cells: [] } as any)
      }
    ];
    const nodes = render(
      React.createElement(HistoryView, {
        model: { settings: { units: 'binary' } } as any,
        state: events.reduce(reduce, initialState()),
        trans: nullTranslator.load(TRANSLATION_DOMAIN),
        sort: DEFAULT_SORT,
        onSort: vi.fn()
      })
    );
    expect(text(byClass(nodes, 'jp-GpuMem-whoHint'))).toBe(
      'No measured cells yet: run a cell with %%gpumem, or switch on %gpumem auto to measure every cell.'
    );
  });
});
