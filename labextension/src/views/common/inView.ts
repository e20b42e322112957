/**
 * Whether an element is on screen (or close to it): the panel draws the trend
 * chart of a device only while its section can be seen. With 8 GPUs most
 * sections are scrolled out of the sidebar, and their charts were 80 % of an
 * update's work (benchmarks/results/chromium-panel-update.json).
 */
import * as React from 'react';

/**
 * A ref for the element, and whether it intersects the viewport (clipped by
 * its scrolling ancestors, such as the panel) grown by `margin`. True until
 * the first observation, and always where IntersectionObserver is missing.
 */
export function useInView<T extends Element>(
  margin = '300px'
): [React.RefObject<T>, boolean] {
  const ref = React.useRef<T>(null);
  const [inView, setInView] = React.useState(true);
  React.useEffect(() => {
    const element = ref.current;
    if (!element || typeof IntersectionObserver === 'undefined') {
      return;
    }
    const observer = new IntersectionObserver(
      entries => {
        const last = entries[entries.length - 1];
        if (last) {
          setInView(last.isIntersecting);
        }
      },
      { rootMargin: margin }
    );
    observer.observe(element);
    return () => observer.disconnect();
  }, [margin]);
  return [ref, inView];
}
