import './base.css';
import './replayBanner.css';
import './overview.css';
import './history.css';
import './segments.css';
import './who.css';
import './onThisGpu.css';
import './statusBar.css';
