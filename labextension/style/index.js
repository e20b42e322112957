import './base.css';
import './replayBanner.css';
import './statusBar.css';
import './forecast.css';
