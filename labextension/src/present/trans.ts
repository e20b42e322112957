/** Translation domain of the extension. */
export const TRANSLATION_DOMAIN = 'jupyter_gpumem';

/**
 * The part of a JupyterLab TranslationBundle the pure helpers need, so that they
 * can be tested without JupyterLab.
 */
export interface ITrans {
  __(msgid: string, ...args: unknown[]): string;
  _n(msgid: string, msgidPlural: string, n: number, ...args: unknown[]): string;
}

// As JupyterLab's Gettext.strfmt: `%%` in a message is a `%`; `%1`, `%2`… are
// the arguments.
function substitute(text: string, args: unknown[]): string {
  return text
    .replace(/%%/g, '%% ')
    .replace(/%(\d+)/g, (whole, index: string) => {
      const i = Number(index) - 1;
      return i >= 0 && i < args.length ? String(args[i]) : whole;
    })
    .replace(/%% /g, '%');
}

/**
 * English strings with JupyterLab's `%1` placeholders filled in, read as
 * JupyterLab's translator reads them.
 */
export const plainTrans: ITrans = {
  __: (msgid, ...args) => substitute(msgid, args),
  _n: (msgid, msgidPlural, n, ...args) =>
    substitute(n === 1 ? msgid : msgidPlural, [n, ...args])
};
